// One rank's layout index (the pieces of one saved rank, as a shard report
// carries it to the coordinator) and the merge of every rank's into the
// step's index (the one MANIFEST.global holds; doc/resharding.md).
//
// RankLayoutIndex builds a rank's blob from its TensorMeta list, as a node
// manifest's index is built. ParseRankLayoutIndex checks a received blob
// whole: its size, the format (ParseLayoutIndex), its world size, and that
// every piece is the rank's. MergeRankLayoutIndexes merges one blob per
// rank into the step's index: the same bytes as BuildLayoutIndex over every
// rank's metas, except that a tensor every rank holds whole but declares
// with another dtype or shape (a per-rank state: a skeleton, an RNG state)
// is left out, as ckptd's LayoutIndex leaves it out: it is no global
// tensor. O(pieces) plus the tensors' name lookups. Pure functions;
// thread-safe.
#ifndef CKPT_STORAGE_LAYOUT_MERGE_H_
#define CKPT_STORAGE_LAYOUT_MERGE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/layout.h"

namespace ckpt::storage {

// A rank's blob is refused above this (a rank with a million pieces fits).
inline constexpr uint64_t kMaxRankLayoutIndexBytes = 16ull << 20;

// The blob of `rank`'s pieces in a step of `world_size` ranks.
absl::StatusOr<std::string> RankLayoutIndex(
    uint32_t world_size, uint32_t rank,
    std::span<const ::ckpt::v1::TensorMeta> metas);

// Checks a received blob of `rank`'s pieces (and its world size, unless
// `world_size` is 0: the caller checks it); errors start with `field`.
absl::StatusOr<LayoutIndex> ParseRankLayoutIndex(std::string_view blob,
                                                 uint32_t rank,
                                                 uint32_t world_size,
                                                 std::string_view field);

// blobs[r] is rank r's; blobs.size() is the world size.
absl::StatusOr<LayoutIndex> MergeRankLayoutIndexes(
    std::span<const std::string_view> blobs);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_LAYOUT_MERGE_H_
