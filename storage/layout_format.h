// The layout index on storage and on the wire: one binary blob per step.
//
//   [0, 4)    magic "CKLI"
//   [4, 8)    version, u32 little-endian (kLayoutIndexVersion)
//   [8, n-8)  body, LEB128 varints (doc/resharding.md):
//               world_size, tensor_count, then per tensor (sorted by name,
//               names unique): name_len, name bytes, dtype, ndim,
//               global_shape[ndim], split_dim, piece_count, then per piece
//               (sorted by offsets[split_dim], then
//               offsets and lengths, then rank): rank, data_offset,
//               offsets[ndim], lengths[ndim]
//   [n-8, n)  XXH3-64 of [0, n-8), u64 little-endian
//
// ParseLayoutIndex checks everything it reads (the checksum, then every
// count against the bytes left, every name, dtype, rank and box) and names
// what is wrong; it never allocates more than the input can describe.
// Pure functions; thread-safe.
#ifndef CKPT_STORAGE_LAYOUT_FORMAT_H_
#define CKPT_STORAGE_LAYOUT_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/layout.h"

namespace ckpt::storage {

inline constexpr char kLayoutIndexMagic[4] = {'C', 'K', 'L', 'I'};
inline constexpr uint32_t kLayoutIndexVersion = 1;

std::string SerializeLayoutIndex(const LayoutIndex& index);
// Declared in layout.h (a friend of LayoutIndex):
// absl::StatusOr<LayoutIndex> ParseLayoutIndex(std::string_view bytes);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_LAYOUT_FORMAT_H_
