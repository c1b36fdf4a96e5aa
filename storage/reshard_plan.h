// The load planner: maps the pieces a new layout asks for onto saved pieces.
//
// Both layouts are LayoutIndex values (the requested one's ranks are the new
// ranks, its data offsets where each requested piece goes in its rank's
// buffer). For each tensor the planner sweeps the saved pieces, sorted along
// the tensor's split dimension, with a running maximum of their ends: the
// saved pieces that may overlap a request [a, b) along that dimension are
// found by a galloping search from the previous request's position (O(1)
// amortized when requests come in order, O(log C) otherwise) and a scan
// while a piece starts before b; the other dimensions are then intersected
// box by box. Each request is covered by taking candidates in preference
// order (the asking rank's own pieces, then its node's, then index order)
// and subtracting each taken box from what is still uncovered, so every
// requested byte is read exactly once even where saved pieces overlap or are
// replicated. A byte no saved piece holds is an error naming the tensor and
// the region. Cost: O((L + C) log C + R) for L requests, C saved pieces and
// R reads (sorting the index is the builder's), plus the scan of pieces that
// overlap a request along the split dimension only; never all-vs-all.
// Memory: one running maximum per saved piece of the tensor being planned.
// Pure functions of their inputs; thread-safe.
#ifndef CKPT_STORAGE_RESHARD_PLAN_H_
#define CKPT_STORAGE_RESHARD_PLAN_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/layout.h"

namespace ckpt::storage {

// One read: the bytes of `box` (global coordinates, inside both pieces)
// from saved piece `saved_piece` into requested piece `request`.
struct PlannedRead {
  uint64_t saved_piece = 0;
  uint64_t request = 0;
  Box box;
};

struct PlanOptions {
  // The node of each saved rank and of each requested rank; a saved piece on
  // the asking rank's node is preferred over a remote one. Empty: only the
  // same rank number counts as local.
  std::span<const uint32_t> saved_node;
  std::span<const uint32_t> requested_node;
};

// Calls `sink` for every read, tensor after tensor (requests of a tensor in
// index order). On error some reads may already have been passed to sink.
[[nodiscard]] absl::Status PlanReshard(
    const LayoutIndex& saved, const LayoutIndex& requested,
    const PlanOptions& options,
    absl::FunctionRef<void(const PlannedRead&)> sink);

// The same for requested tensors [first_tensor, end_tensor) only: tensors
// are independent, so a caller may plan ranges on several threads, each
// with its own sink.
[[nodiscard]] absl::Status PlanReshardTensors(
    const LayoutIndex& saved, const LayoutIndex& requested,
    const PlanOptions& options, size_t first_tensor, size_t end_tensor,
    absl::FunctionRef<void(const PlannedRead&)> sink);

// The same, collected per requested rank.
absl::StatusOr<std::vector<std::vector<PlannedRead>>> PlanReshardByRank(
    const LayoutIndex& saved, const LayoutIndex& requested,
    const PlanOptions& options = {});

// The byte ranges of one read: calls fn(source_offset, dest_offset, bytes)
// for each contiguous run, offsets from the start of the saved piece and of
// the requested piece (row-major), in increasing order.
void ForEachByteRun(const LayoutIndex& saved, const LayoutIndex& requested,
                    const PlannedRead& read,
                    absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_RESHARD_PLAN_H_
