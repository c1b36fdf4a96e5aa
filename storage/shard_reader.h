// Reading shard files through a storage::Backend: metadata only
// (ReadShardInfo) or every tensor's bytes checked against its stored
// checksum (VerifyShard). Anything read is untrusted: a garbage, truncated or
// bit-flipped object yields DataLoss naming the field or tensor, and no
// allocation exceeds the object's size. Thread-safe (no shared state).
#ifndef CKPT_STORAGE_SHARD_READER_H_
#define CKPT_STORAGE_SHARD_READER_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/shard_format.h"

namespace ckpt::storage {

// Reads the header block, the index and the footer of the shard at key and
// validates them (DecodeShardMetadata). NotFound if the key is absent.
absl::StatusOr<ShardInfo> ReadShardInfo(Backend& backend, std::string_view key);

// Called once per tensor, in index order, with the checksum computed over its
// bytes as read (compare with tensor.checksum).
using VerifyCallback = std::function<void(const ShardTensor& tensor, uint64_t computed)>;

// Reads every tensor of the shard at key in large aligned reads and checks it
// with TensorChecksum. OK when all match; otherwise DataLoss naming the first
// mismatching tensor ("<key>: tensor \"x\": checksum mismatch (stored 0x..,
// computed 0x..)") and how many others mismatched. on_tensor may be empty.
absl::Status VerifyShard(Backend& backend, std::string_view key,
                         const VerifyCallback& on_tensor = nullptr);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SHARD_READER_H_
