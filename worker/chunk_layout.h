// Packing of a model's fp32 tensors into fixed-size chunks. Tensors are placed
// in order by Next-Fit: a tensor goes into the current chunk if it fits,
// otherwise it opens a new chunk; a tensor never spans two chunks. The chunk
// size may be given, or searched for: every candidate size in a range is laid
// out from scratch and the one with the least wasted space (allocated but
// unused elements, the last chunk's tail included) wins, the smaller size on a
// tie. All functions are pure and thread-safe.
#ifndef CKPT_WORKER_CHUNK_LAYOUT_H_
#define CKPT_WORKER_CHUNK_LAYOUT_H_

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::worker {

struct TensorSpec {
  std::string name;
  size_t numel = 0;
};

struct TensorSlot {
  size_t chunk = 0;
  size_t offset = 0;  // elements from the chunk's start
  size_t numel = 0;
};

struct ChunkLayout {
  size_t chunk_elems = 0;
  std::vector<TensorSlot> slots;   // one per tensor, in input order
  std::vector<size_t> chunk_used;  // elements used in each chunk
  size_t waste_elems = 0;

  size_t num_chunks() const { return chunk_used.size(); }
};

// Candidate sizes are min_elems, min_elems + step_elems, ... <= max_elems.
struct ChunkSearchRange {
  size_t min_elems = 0;
  size_t max_elems = 0;
  size_t step_elems = 0;
};

// InvalidArgument naming the tensor if it has an invalid name or no elements,
// or if tensors is empty.
[[nodiscard]] absl::Status ValidateTensors(std::span<const TensorSpec> tensors);

// InvalidArgument naming the largest tensor when chunk_elems is smaller.
[[nodiscard]] absl::StatusOr<ChunkLayout> NextFitLayout(
    std::span<const TensorSpec> tensors, size_t chunk_elems);

// The least-waste layout over the range; InvalidArgument if the range is
// malformed or holds no size that fits the largest tensor.
[[nodiscard]] absl::StatusOr<ChunkLayout> SearchChunkSize(
    std::span<const TensorSpec> tensors, const ChunkSearchRange& range);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_CHUNK_LAYOUT_H_
