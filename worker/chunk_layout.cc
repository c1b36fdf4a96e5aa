#include "worker/chunk_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "util/validate.h"

namespace ckpt::worker {

namespace {

const TensorSpec& Largest(std::span<const TensorSpec> tensors) {
  return *std::max_element(tensors.begin(), tensors.end(),
                           [](const TensorSpec& a, const TensorSpec& b) {
                             return a.numel < b.numel;
                           });
}

// Assumes validated tensors and chunk_elems >= the largest tensor.
ChunkLayout Place(std::span<const TensorSpec> tensors, size_t chunk_elems) {
  ChunkLayout layout;
  layout.chunk_elems = chunk_elems;
  layout.slots.reserve(tensors.size());
  for (const TensorSpec& t : tensors) {
    if (layout.chunk_used.empty() ||
        layout.chunk_used.back() + t.numel > chunk_elems) {
      layout.chunk_used.push_back(0);
    }
    layout.slots.push_back(
        {layout.chunk_used.size() - 1, layout.chunk_used.back(), t.numel});
    layout.chunk_used.back() += t.numel;
  }
  size_t total = 0;
  for (size_t used : layout.chunk_used) total += used;
  layout.waste_elems = layout.num_chunks() * chunk_elems - total;
  return layout;
}

}  // namespace

absl::Status ValidateTensors(std::span<const TensorSpec> tensors) {
  if (tensors.empty())
    return absl::InvalidArgumentError("optimizer: no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::string field = absl::StrCat("tensors[", i, "].name");
    absl::Status s = ValidateTensorName(tensors[i].name, field);
    if (!s.ok()) return s;
    if (tensors[i].numel == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensors[i].name, "': has no elements"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ChunkLayout> NextFitLayout(std::span<const TensorSpec> tensors,
                                          size_t chunk_elems) {
  absl::Status s = ValidateTensors(tensors);
  if (!s.ok()) return s;
  const TensorSpec& largest = Largest(tensors);
  if (chunk_elems < largest.numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_elems ", chunk_elems, " is smaller than tensor '", largest.name,
        "' (", largest.numel, " elements); a tensor never spans chunks"));
  }
  return Place(tensors, chunk_elems);
}

absl::StatusOr<ChunkLayout> SearchChunkSize(std::span<const TensorSpec> tensors,
                                            const ChunkSearchRange& range) {
  absl::Status s = ValidateTensors(tensors);
  if (!s.ok()) return s;
  if (range.step_elems == 0 || range.min_elems == 0 ||
      range.max_elems < range.min_elems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk search range: need 0 < min_elems <= max_elems and step_elems > "
        "0, got [",
        range.min_elems, ", ", range.max_elems, "] step ", range.step_elems));
  }
  const TensorSpec& largest = Largest(tensors);
  bool found = false;
  ChunkLayout best;
  for (size_t c = range.min_elems; c <= range.max_elems;
       c += range.step_elems) {
    if (c < largest.numel) continue;
    // Each candidate is laid out from scratch, so its waste starts at zero.
    ChunkLayout candidate = Place(tensors, c);
    if (!found || candidate.waste_elems < best.waste_elems) {
      best = std::move(candidate);
      found = true;
    }
    if (range.max_elems - c < range.step_elems) break;  // no overflow past max
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk search range [", range.min_elems, ", ",
                     range.max_elems, "] holds no size that fits tensor '",
                     largest.name, "' (", largest.numel, " elements)"));
  }
  return best;
}

}  // namespace ckpt::worker
