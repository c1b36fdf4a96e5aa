// The one validator and checksum verifier of shard images (shard_format.h)
// that sit in memory: a slot's image found after a restart, an image loaded
// from storage, the bytes about to be persisted or uploaded. ShardReader
// validates shards read from a Backend; these functions validate the same
// format where the whole image is already in memory, and say the same
// things about it.
//
// Everything checked is untrusted (the job's processes can write to the
// slots): errors are DataLoss naming `what` (a key, a slot) and the field
// or tensor. Functions only; thread-safe.
#ifndef CKPT_STORAGE_SHARD_IMAGE_H_
#define CKPT_STORAGE_SHARD_IMAGE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/shard_format.h"

namespace ckpt::storage {

// The shard an image must hold.
struct ImageExpect {
  std::string_view job;
  uint64_t step = 0;
  uint32_t rank = 0;
};

// Validates the image's header, index and footer (every byte of `image` is
// the shard: its size is the file's) and that it holds `expect`'s shard.
// Returns its index, with the commit time the header carries.
[[nodiscard]] absl::StatusOr<ShardInfo> ValidateImage(
    std::span<const char> image, const ImageExpect& expect,
    std::string_view what);

// Checks that `got` (decoded from an image or a file) has the tensor index
// `want` records: the same number of tensors with the same names, offsets
// and sizes, and the same checksums where `known[i]` (every one when
// `known` is empty; a device tensor's checksum is not known at commit).
// DataLoss naming `what` and the first tensor that differs.
[[nodiscard]] absl::Status SameIndex(const ShardInfo& got,
                                     const ShardInfo& want,
                                     const std::vector<bool>& known,
                                     std::string_view what);

// Computes each tensor's checksum over the bytes at `image` (which holds
// the shard `info` describes) and compares it with the recorded one, for
// the tensors where `known[i]` (every one when `known` is empty). DataLoss
// naming `what` and the first tensor that mismatches:
// "<what>: tensor \"x\": checksum mismatch (recorded .., found ..)".
[[nodiscard]] absl::Status VerifyTensorChecksums(
    const char* image, const ShardInfo& info, std::string_view what,
    const std::vector<bool>& known = {});
// The same for tensor `i` of `info` alone.
[[nodiscard]] absl::Status VerifyTensorChecksum(const char* image,
                                                const ShardInfo& info,
                                                std::string_view what,
                                                size_t i);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SHARD_IMAGE_H_
