// Small helpers shared by the engine's files: the conversion between the
// RPC's tensor index and the shard format's (and util/log.h's logging).
#ifndef CKPT_DAEMON_CORE_ENGINE_UTIL_H_
#define CKPT_DAEMON_CORE_ENGINE_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt.pb.h"
#include "google/protobuf/repeated_field.h"
#include "storage/shard_format.h"
#include "util/log.h"

namespace ckpt::daemon {

// FailedPrecondition for a save of `step` that would drop the rank's
// `newer` steps without being asked to: names them and how to proceed.
absl::Status BelowNewestError(const std::string& job, uint32_t rank,
                              uint64_t step,
                              const std::vector<uint64_t>& newer);

// A new job record's life (catalog JobRecord.life_ns): now, in ns since
// the epoch. Only the records of one node are compared with each other.
uint64_t NewJobLife();

storage::ShardInfo ToShardInfo(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors);
// Which tensors of an index have a checksum the client computed (false:
// a device tensor's, computed by the persister): what
// storage::VerifyTensorChecksums and storage::SameIndex take as `known`.
std::vector<bool> KnownChecksums(
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors);

// info's index as TensorMetas into *out. An entry it replaces keeps its
// chunk_hashes where the tensor is the same (name, offset, bytes,
// checksum): the shard file does not carry them.
void ToTensorMetas(const storage::ShardInfo& info,
                   google::protobuf::RepeatedPtrField<v1::TensorMeta>* out);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_ENGINE_UTIL_H_
