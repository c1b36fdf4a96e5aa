// Tensor layouts: where each saved piece sits in its global tensor, and the
// index of every piece of every tensor of every rank of one step.
//
// A piece is a box of a global tensor: per dimension an offset and a length
// (row-major bytes, lengths product x dtype size). A rank may hold several
// pieces of one tensor; several ranks may hold the same piece (replicas). A
// tensor saved without layout fields is one whole piece.
//
// LayoutIndex is the in-memory form (struct of arrays, pieces grouped by
// tensor and sorted along each tensor's split dimension, the order the
// planner sweeps); layout_format.h writes and reads it. LayoutIndexBuilder
// validates every piece it is given; a finished index is immutable and safe
// to read from many threads. doc/resharding.md describes the format.
#ifndef CKPT_STORAGE_LAYOUT_H_
#define CKPT_STORAGE_LAYOUT_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt::v1 {
class TensorMeta;
}

namespace ckpt::storage {

class LayoutIndex;
// layout_format.h
absl::StatusOr<LayoutIndex> ParseLayoutIndex(std::string_view bytes);

// A box of a global tensor; dims beyond ndim are unused.
struct Box {
  uint32_t ndim = 0;
  std::array<uint64_t, kMaxTensorDims> offsets{};
  std::array<uint64_t, kMaxTensorDims> lengths{};

  uint64_t Elements() const;     // product of lengths (1 for a scalar)
  std::string ToString() const;  // "offsets [0, 4] lengths [2, 4]"
  friend bool operator==(const Box& a, const Box& b);
};

struct LayoutTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  uint32_t ndim = 0;
  std::array<uint64_t, kMaxTensorDims> global_shape{};
  // The dimension the pieces are sorted along: the first where their
  // offsets differ (0 when they never do).
  uint32_t split_dim = 0;
  uint64_t first_piece = 0;  // pieces [first_piece, first_piece + num_pieces)
  uint64_t num_pieces = 0;
  uint64_t coord_base = 0;  // where its pieces' coordinates start
};

class LayoutIndex {
 public:
  uint32_t world_size() const { return world_size_; }
  const std::vector<LayoutTensor>& tensors() const { return tensors_; }
  uint64_t num_pieces() const { return rank_.size(); }
  // The tensor's position in tensors() (sorted by name), or -1.
  int64_t FindTensor(std::string_view name) const;
  uint32_t piece_tensor(uint64_t p) const { return tensor_of_[p]; }
  uint32_t piece_rank(uint64_t p) const { return rank_[p]; }
  // Byte offset of the piece in its rank's shard image (or, for a requested
  // layout, in the destination buffer): the reader's business, carried along.
  uint64_t piece_data_offset(uint64_t p) const { return data_offset_[p]; }
  // The piece's ndim offsets followed by its ndim lengths.
  const uint64_t* piece_coords(uint64_t p) const {
    const LayoutTensor& t = tensors_[tensor_of_[p]];
    return coords_.data() + t.coord_base + (p - t.first_piece) * 2 * t.ndim;
  }
  uint64_t piece_offset(uint64_t p, uint32_t d) const {
    return piece_coords(p)[d];
  }
  uint64_t piece_length(uint64_t p, uint32_t d) const {
    return piece_coords(p)[tensors_[tensor_of_[p]].ndim + d];
  }
  Box PieceBox(uint64_t p) const;
  // Bytes the index holds in memory.
  uint64_t MemoryBytes() const;

 private:
  friend class LayoutIndexBuilder;
  friend absl::StatusOr<LayoutIndex> ParseLayoutIndex(std::string_view bytes);
  uint32_t world_size_ = 0;
  std::vector<LayoutTensor> tensors_;
  std::vector<uint32_t> tensor_of_;
  std::vector<uint32_t> rank_;
  std::vector<uint64_t> data_offset_;
  // Per piece its ndim offsets then ndim lengths, tensor after tensor.
  std::vector<uint64_t> coords_;
};

// Collects tensors and pieces, validating each; Finish() groups and sorts.
class LayoutIndexBuilder {
 public:
  explicit LayoutIndexBuilder(uint32_t world_size) : world_size_(world_size) {}

  // Declares a global tensor (or returns the id of the same name; refused
  // when the name is already declared with another dtype or shape).
  absl::StatusOr<uint32_t> AddTensor(std::string_view name, DType dtype,
                                     std::span<const uint64_t> global_shape);
  // A piece of tensor `tensor` held by `rank`; `field` names it in errors.
  absl::Status AddPiece(uint32_t tensor, uint32_t rank, uint64_t data_offset,
                        std::span<const uint64_t> offsets,
                        std::span<const uint64_t> lengths,
                        std::string_view field = "piece");
  void Reserve(uint64_t tensors, uint64_t pieces);
  absl::StatusOr<LayoutIndex> Finish() &&;

 private:
  uint32_t world_size_;
  std::vector<LayoutTensor> tensors_;
  std::vector<uint32_t> tensor_of_;
  std::vector<uint32_t> rank_;
  std::vector<uint64_t> data_offset_;
  std::vector<uint64_t> coords_;
  std::vector<uint64_t> piece_coord_;  // where each piece's coords start
  std::unordered_map<std::string, uint32_t> by_name_;
};

// Checks the layout fields of one TensorMeta: dtype known; global_shape
// unset, or as many dims as shape with piece_offsets as many; each offset +
// length within the global shape; bytes == product(shape) x dtype size;
// global_name a valid name and only with a global_shape. `field` prefixes
// every error ("tensors[3]").
[[nodiscard]] absl::Status ValidateTensorLayout(
    const ::ckpt::v1::TensorMeta& meta, std::string_view field);

// The index of one step from every rank's TensorMeta list (shards[r] is rank
// r's, so shards.size() must equal world_size). Every meta is validated; a
// global tensor must have one dtype and shape on every rank. data offsets
// are each meta's `offset`.
absl::StatusOr<LayoutIndex> BuildLayoutIndex(
    uint32_t world_size,
    std::span<const std::vector<::ckpt::v1::TensorMeta>> shards);

// The pieces of one rank's shard, from its TensorMeta list (validated as
// BuildLayoutIndex does; errors are prefixed "<field>.tensors[i]").
[[nodiscard]] absl::Status AddShardPieces(
    LayoutIndexBuilder& b, uint32_t rank,
    std::span<const ::ckpt::v1::TensorMeta> metas, std::string_view field);
// The pieces of `rank` in another index (a node manifest's), with every
// tensor `from` declares: merging indexes of several nodes into one.
[[nodiscard]] absl::Status AddIndexPieces(LayoutIndexBuilder& b,
                                          const LayoutIndex& from,
                                          uint32_t rank,
                                          std::string_view field);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_LAYOUT_H_
