// Small helpers shared by the engine's files: logging to stderr and the
// conversion between the RPC's tensor index and the shard format's.
#ifndef CKPT_DAEMON_ENGINE_UTIL_H_
#define CKPT_DAEMON_ENGINE_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "ckpt.pb.h"
#include "google/protobuf/repeated_field.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

void LogInfo(const std::string& msg);
void LogWarning(const std::string& msg);

storage::ShardInfo ToShardInfo(
    const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors);
// Validates a shard image that sits in memory (loaded from disk, or found
// in a re-attached slot) and checks that it holds (job, step, rank).
[[nodiscard]] absl::Status CheckLoadedImage(const char* image, uint64_t bytes,
                                            const std::string& job,
                                            uint64_t step, uint32_t rank,
                                            const std::string& what);

// One 64-bit digest of a shard's tensor checksums, in index order (the
// node manifest and the coordinator's global manifest carry it).
uint64_t ShardDigest(
    const google::protobuf::RepeatedPtrField<v1::TensorMeta>& tensors);

void ToTensorMetas(const storage::ShardInfo& info,
                   google::protobuf::RepeatedPtrField<v1::TensorMeta>* out);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_UTIL_H_
