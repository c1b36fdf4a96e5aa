// Ranged reads (ranged_read.h).
#include "daemon/replica/ranged_read.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "util/checksum.h"

namespace ckpt::daemon {

absl::StatusOr<std::vector<ImageRange>> ValidateRanges(
    std::span<const uint64_t> offsets, std::span<const uint64_t> lengths,
    std::optional<uint64_t> image_bytes, std::string_view field_view) {
  const std::string field(
      field_view);  // (absl::StrCat takes no std::string_view here)
  if (offsets.size() != lengths.size())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", offsets.size(),
                                                   " offsets and ",
                                                   lengths.size(), " lengths"));
  if (offsets.size() > kMaxRanges)
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", offsets.size(), " ranges, at most ", kMaxRanges));
  std::vector<ImageRange> out;
  out.reserve(offsets.size());
  uint64_t end = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    const uint64_t off = offsets[i], len = lengths[i];
    if (len == 0)
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "].length: 0 bytes"));
    if (len > UINT64_MAX - off ||
        (image_bytes && (off > *image_bytes || len > *image_bytes - off)))
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: bytes [", off, ", +", len, ") past image_bytes ",
          image_bytes.value_or(UINT64_MAX)));
    if (i > 0 && off < end)
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "].offset: ", off,
                       ", before the end of the range before it (", end,
                       "): ranges are sorted and disjoint"));
    end = off + len;
    out.push_back({off, len});
  }
  return out;
}

std::vector<TouchedChunk> TouchedChunks(const storage::ShardInfo& info,
                                        std::span<const ImageRange> ranges) {
  std::vector<TouchedChunk> out;
  // Tensors lie in index order at increasing offsets (shard-format.md).
  const std::vector<storage::ShardTensor>& ts = info.tensors;
  size_t t = 0;
  for (const ImageRange& r : ranges) {
    const uint64_t a = r.offset, b = r.offset + r.length;
    // The first tensor ending after a: ranges are sorted, so never back.
    while (t < ts.size() && ts[t].offset + ts[t].bytes <= a) ++t;
    for (size_t k = t; k < ts.size() && ts[k].offset < b; ++k) {
      const storage::ShardTensor& x = ts[k];
      if (x.bytes == 0) continue;
      const uint64_t lo = std::max(a, x.offset) - x.offset;
      const uint64_t hi = std::min(b, x.offset + x.bytes) - x.offset;
      if (lo >= hi) continue;
      for (uint64_t c = lo / kChecksumChunk; c <= (hi - 1) / kChecksumChunk;
           ++c) {
        // Two ranges may share a chunk: it is listed once.
        if (!out.empty() && out.back().tensor == k && out.back().chunk >= c)
          continue;
        const uint64_t at = c * kChecksumChunk;
        out.push_back({static_cast<uint32_t>(k), c, x.offset + at,
                       std::min(kChecksumChunk, x.bytes - at)});
      }
    }
  }
  return out;
}

}  // namespace ckpt::daemon
