#include "storage/layout_merge.h"

#include <unordered_map>
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

absl::StatusOr<LayoutIndex> MergeRankLayoutIndexes(
    std::span<const std::string_view> blobs) {
  const uint32_t world_size = static_cast<uint32_t>(blobs.size());
  if (world_size == 0) return Refused("blobs", "none (world_size 0)");
  std::vector<LayoutIndex> ranks;
  ranks.reserve(world_size);
  uint64_t pieces = 0;
  for (uint32_t r = 0; r < world_size; ++r) {
    CKPT_ASSIGN_OR_RETURN(
        LayoutIndex index,
        ParseRankLayoutIndex(blobs[r], r, world_size,
                             absl::StrFormat("rank %d: layout_index", r)));
    pieces += index.num_pieces();
    ranks.push_back(std::move(index));
  }
  // First pass: which names are each rank's own whole tensor (declared
  // with other dtypes or shapes, whole wherever held).
  struct Declared {
    const LayoutTensor* first = nullptr;
    bool differs = false;
    bool whole = true;
    int64_t id = -1;  // in the builder, once declared
  };
  std::unordered_map<std::string_view, Declared> declared;
  declared.reserve(ranks[0].tensors().size());
  for (const LayoutIndex& index : ranks)
    for (const LayoutTensor& t : index.tensors()) {
      Declared& d = declared[t.name];
      if (d.first == nullptr) {
        d.first = &t;
      } else if (d.first->dtype != t.dtype || d.first->ndim != t.ndim ||
                 !std::equal(t.global_shape.begin(),
                             t.global_shape.begin() + t.ndim,
                             d.first->global_shape.begin())) {
        d.differs = true;
      }
      if (d.whole && !AllWhole(index, t)) d.whole = false;
    }
  LayoutIndexBuilder b(world_size);
  b.Reserve(declared.size(), pieces);
  for (uint32_t r = 0; r < world_size; ++r) {
    const LayoutIndex& index = ranks[r];
    for (const LayoutTensor& t : index.tensors()) {
      Declared& d = declared[t.name];
      if (d.differs && d.whole) continue;  // a per-rank state: left out
      const std::string field =
          absl::StrFormat("rank %d: tensor %s", r, QuotePrefix(t.name));
      if (d.id < 0 || d.differs) {
        // Declared differently and not whole: refused here, naming it.
        absl::StatusOr<uint32_t> id = b.AddTensor(
            t.name, t.dtype,
            std::span<const uint64_t>(t.global_shape.data(), t.ndim));
        if (!id.ok()) return Refused(field, std::string(id.status().message()));
        d.id = *id;
      }
      for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p) {
        const uint64_t* c = index.piece_coords(p);
        CKPT_RETURN_IF_ERROR(b.AddPiece(
            static_cast<uint32_t>(d.id), r, index.piece_data_offset(p),
            std::span<const uint64_t>(c, t.ndim),
            std::span<const uint64_t>(c + t.ndim, t.ndim), field));
      }
    }
  }
  return std::move(b).Finish();
}

}  // namespace ckpt::storage
