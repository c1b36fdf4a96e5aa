// A ranged read of a shard image from a peer (doc/resharding.md, "Byte
// ranges from a peer"): the byte ranges a resharded restore reads, checked
// as any input, and the 1 MiB checksum chunks of the tensors they touch
// (the verification unit, util/checksum.h). The holder (replica_service)
// and the receiver (replica_source) compute the same chunks from the same
// ranges and the image's index. Functions only; thread-safe.
#ifndef CKPT_DAEMON_REPLICA_RANGED_READ_H_
#define CKPT_DAEMON_REPLICA_RANGED_READ_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/ranged_slot.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

inline constexpr size_t kMaxRanges = 65536;

// The ranges `offsets[i]`, `lengths[i]`: as many of each, at most
// kMaxRanges, each at least one byte, sorted and disjoint, and inside
// `image_bytes` when it is known. InvalidArgument naming the field
// ("<field>[3].length: 0 bytes").
[[nodiscard]] absl::StatusOr<std::vector<ImageRange>> ValidateRanges(
    std::span<const uint64_t> offsets, std::span<const uint64_t> lengths,
    std::optional<uint64_t> image_bytes, std::string_view field);

// A checksum chunk of a tensor: tensor (index order), chunk (its number),
// and where it lies in the image.
struct TouchedChunk {
  uint32_t tensor = 0;
  uint64_t chunk = 0;
  uint64_t at = 0;     // in the image
  uint64_t bytes = 0;  // kChecksumChunk, or less for a tensor's last
};

// The chunks that `ranges` (validated) touch, in image order, each once.
// A range's bytes outside every tensor (header, index, padding, footer)
// touch none.
std::vector<TouchedChunk> TouchedChunks(const storage::ShardInfo& info,
                                        std::span<const ImageRange> ranges);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_RANGED_READ_H_
