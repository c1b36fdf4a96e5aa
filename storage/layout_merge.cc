#include "storage/layout_merge.h"

#include <array>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt.pb.h"
#include "storage/layout_format.h"
#include "util/status.h"
#include "util/strings.h"

namespace ckpt::storage {
namespace {

absl::Status Refused(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(AV(field), ": ", AV(what)));
}

// Whether every piece of tensor `t` is the whole global tensor.
bool AllWhole(const LayoutIndex& index, const LayoutTensor& t) {
  for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p)
    for (uint32_t d = 0; d < t.ndim; ++d)
      if (index.piece_offset(p, d) != 0 ||
          index.piece_length(p, d) != t.global_shape[d])
        return false;
  return true;
}

}  // namespace

absl::StatusOr<std::string> RankLayoutIndex(
    uint32_t world_size, uint32_t rank,
    std::span<const ::ckpt::v1::TensorMeta> metas) {
  if (rank >= world_size)
    return Refused("rank",
                   absl::StrFormat("%d, world_size is %d", rank, world_size));
  LayoutIndexBuilder b(world_size);
  b.Reserve(metas.size(), metas.size());
  CKPT_RETURN_IF_ERROR(
      AddShardPieces(b, rank, metas, absl::StrFormat("rank %d", rank)));
  CKPT_ASSIGN_OR_RETURN(LayoutIndex index, std::move(b).Finish());
  return SerializeLayoutIndex(index);
}

absl::StatusOr<LayoutIndex> ParseRankLayoutIndex(std::string_view blob,
                                                 uint32_t rank,
                                                 uint32_t world_size,
                                                 std::string_view field) {
  if (blob.size() > kMaxRankLayoutIndexBytes)
    return Refused(field, absl::StrFormat("%d bytes, more than %d", blob.size(),
                                          kMaxRankLayoutIndexBytes));
  absl::StatusOr<LayoutIndex> index = ParseLayoutIndex(blob);
  if (!index.ok()) return Refused(field, std::string(index.status().message()));
  if (world_size != 0 && index->world_size() != world_size)
    return Refused(field, absl::StrFormat("world_size %d, the step's is %d",
                                          index->world_size(), world_size));
  for (const LayoutTensor& t : index->tensors())
    for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p)
      if (index->piece_rank(p) != rank)
        return Refused(
            field,
            absl::StrFormat("tensor %s: a piece of rank %d, in "
                            "the index of rank %d",
                            QuotePrefix(t.name), index->piece_rank(p), rank));
  return index;
}

namespace {

// One pass over the blobs into a builder, one rank's index in memory at a
// time. A tensor is declared once per distinct declaration: a rank whose
// i-th tensor is the previous rank's i-th (the usual case: every rank
// saves the same state) reuses its id without a lookup. `left_out`: names
// not merged. A tensor declared with another dtype or shape than before
// sets *conflict and refuses the merge.
absl::StatusOr<LayoutIndex> MergePass(
    std::span<const std::string_view> blobs,
    const std::unordered_set<std::string>* left_out, bool* conflict) {
  const uint32_t world_size = static_cast<uint32_t>(blobs.size());
  LayoutIndexBuilder b(world_size);
  struct Declared {
    std::string name;
    DType dtype = DType::kFloat32;
    uint32_t ndim = 0;
    std::array<uint64_t, kMaxTensorDims> shape{};
    uint32_t id = 0;
  };
  std::vector<Declared> last;  // by position in the previous rank's list
  for (uint32_t r = 0; r < world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(
        LayoutIndex index,
        ParseRankLayoutIndex(blobs[r], r, world_size,
                             absl::StrFormat("rank %d: layout_index", r)));
    if (r == 0)
      b.Reserve(index.tensors().size(), index.num_pieces() * world_size);
    const auto& tensors = index.tensors();
    if (last.size() < tensors.size()) last.resize(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const LayoutTensor& t = tensors[i];
      if (left_out != nullptr && left_out->count(t.name)) continue;
      auto where = [&] {
        return absl::StrFormat("rank %d: tensor %s", r, QuotePrefix(t.name));
      };
      Declared& d = last[i];
      if (d.name != t.name || d.dtype != t.dtype || d.ndim != t.ndim ||
          d.shape != t.global_shape) {
        absl::StatusOr<uint32_t> id = b.AddTensor(
            t.name, t.dtype,
            std::span<const uint64_t>(t.global_shape.data(), t.ndim));
        if (!id.ok()) {
          // The blobs parsed: only a second declaration fails here.
          *conflict = true;
          return Refused(where(), std::string(id.status().message()));
        }
        d = Declared{t.name, t.dtype, t.ndim, t.global_shape, *id};
      }
      for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p) {
        const uint64_t* c = index.piece_coords(p);
        if (absl::Status s =
                b.AddPiece(d.id, r, index.piece_data_offset(p),
                           std::span<const uint64_t>(c, t.ndim),
                           std::span<const uint64_t>(c + t.ndim, t.ndim));
            !s.ok())
          return Refused(where(), std::string(s.message()));
      }
    }
  }
  return std::move(b).Finish();
}

}  // namespace

absl::StatusOr<LayoutIndex> MergeRankLayoutIndexes(
    std::span<const std::string_view> blobs) {
  const uint32_t world_size = static_cast<uint32_t>(blobs.size());
  if (world_size == 0) return Refused("blobs", "none (world_size 0)");
  bool conflict = false;
  absl::StatusOr<LayoutIndex> merged = MergePass(blobs, nullptr, &conflict);
  if (merged.ok() || !conflict) return merged;
  // A name declared two ways: each rank's own whole tensor (a skeleton, an
  // RNG state) is left out, found by a first pass over the declarations.
  struct Seen {
    DType dtype;
    uint32_t ndim;
    std::array<uint64_t, kMaxTensorDims> shape;
    bool differs = false;
    bool whole = true;
  };
  std::unordered_map<std::string, Seen> seen;
  for (uint32_t r = 0; r < world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(
        LayoutIndex index,
        ParseRankLayoutIndex(blobs[r], r, world_size,
                             absl::StrFormat("rank %d: layout_index", r)));
    for (const LayoutTensor& t : index.tensors()) {
      auto [it, first] =
          seen.try_emplace(t.name, Seen{t.dtype, t.ndim, t.global_shape});
      Seen& s = it->second;
      if (!first &&
          (s.dtype != t.dtype || s.ndim != t.ndim || s.shape != t.global_shape))
        s.differs = true;
      if (s.whole && !AllWhole(index, t)) s.whole = false;
    }
  }
  std::unordered_set<std::string> left_out;
  for (const auto& [name, s] : seen)
    if (s.differs && s.whole) left_out.insert(name);
  if (left_out.empty()) return merged;  // a sharded tensor declared two ways
  return MergePass(blobs, &left_out, &conflict);
}

}  // namespace ckpt::storage
