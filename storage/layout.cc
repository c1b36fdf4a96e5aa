#include "storage/layout.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt.pb.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

absl::Status Invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(AV(field), ": ", AV(what)));
}

// product(lengths) * elem, or false on overflow.
bool BytesOf(std::span<const uint64_t> lengths, uint64_t elem, uint64_t* out) {
  uint64_t n = elem;
  for (uint64_t l : lengths) {
    if (l != 0 && n > UINT64_MAX / l) return false;
    n *= l;
  }
  *out = n;
  return true;
}

}  // namespace

uint64_t Box::Elements() const {
  uint64_t n = 1;
  for (uint32_t d = 0; d < ndim; ++d) n *= lengths[d];
  return n;
}

std::string Box::ToString() const {
  return absl::StrCat(
      "offsets [",
      absl::StrJoin(std::span<const uint64_t>(offsets.data(), ndim), ", "),
      "] lengths [",
      absl::StrJoin(std::span<const uint64_t>(lengths.data(), ndim), ", "),
      "]");
}

bool operator==(const Box& a, const Box& b) {
  if (a.ndim != b.ndim) return false;
  for (uint32_t d = 0; d < a.ndim; ++d)
    if (a.offsets[d] != b.offsets[d] || a.lengths[d] != b.lengths[d])
      return false;
  return true;
}

int64_t LayoutIndex::FindTensor(std::string_view name) const {
  auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), name,
      [](const LayoutTensor& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return -1;
  return it - tensors_.begin();
}

Box LayoutIndex::PieceBox(uint64_t p) const {
  Box b;
  b.ndim = tensors_[tensor_of_[p]].ndim;
  const uint64_t* c = piece_coords(p);
  for (uint32_t d = 0; d < b.ndim; ++d) {
    b.offsets[d] = c[d];
    b.lengths[d] = c[b.ndim + d];
  }
  return b;
}

uint64_t LayoutIndex::MemoryBytes() const {
  uint64_t n = tensors_.capacity() * sizeof(LayoutTensor);
  for (const LayoutTensor& t : tensors_) n += t.name.capacity();
  return n + tensor_of_.capacity() * 4 + rank_.capacity() * 4 +
         data_offset_.capacity() * 8 + coords_.capacity() * 8;
}

void LayoutIndexBuilder::Reserve(uint64_t tensors, uint64_t pieces) {
  tensors_.reserve(tensors);
  tensor_of_.reserve(pieces);
  rank_.reserve(pieces);
  data_offset_.reserve(pieces);
  piece_coord_.reserve(pieces);
}

absl::StatusOr<uint32_t> LayoutIndexBuilder::AddTensor(
    std::string_view name, DType dtype,
    std::span<const uint64_t> global_shape) {
  if (absl::Status s = ValidateTensorName(name, "name"); !s.ok()) return s;
  if (!IsValidDType(static_cast<uint32_t>(dtype)))
    return Invalid("dtype", absl::StrFormat("%d is not a known dtype",
                                            static_cast<uint32_t>(dtype)));
  if (global_shape.size() > kMaxTensorDims)
    return Invalid("global_shape",
                   absl::StrFormat("%d dims, at most %d allowed",
                                   global_shape.size(), kMaxTensorDims));
  uint64_t bytes;
  if (!BytesOf(global_shape, DTypeSize(dtype), &bytes))
    return Invalid("global_shape", "bytes overflow 64 bits");
  auto it = by_name_.find(std::string(name));
  if (it != by_name_.end()) {
    const LayoutTensor& t = tensors_[it->second];
    if (t.dtype != dtype || t.ndim != global_shape.size() ||
        !std::equal(global_shape.begin(), global_shape.end(),
                    t.global_shape.begin()))
      return Invalid(absl::StrCat("tensor ", QuotePrefix(name)),
                     "another piece declared another dtype or global_shape");
    return it->second;
  }
  LayoutTensor t;
  t.name = std::string(name);
  t.dtype = dtype;
  t.ndim = global_shape.size();
  std::copy(global_shape.begin(), global_shape.end(), t.global_shape.begin());
  tensors_.push_back(std::move(t));
  by_name_.emplace(std::string(name), tensors_.size() - 1);
  return tensors_.size() - 1;
}

absl::Status LayoutIndexBuilder::AddPiece(uint32_t tensor, uint32_t rank,
                                          uint64_t data_offset,
                                          std::span<const uint64_t> offsets,
                                          std::span<const uint64_t> lengths,
                                          std::string_view field) {
  if (tensor >= tensors_.size())
    return Invalid(field,
                   absl::StrFormat("tensor id %d is not declared", tensor));
  if (rank >= world_size_)
    return Invalid(field, absl::StrFormat("rank %d, must be below world_size "
                                          "%d",
                                          rank, world_size_));
  const LayoutTensor& t = tensors_[tensor];
  if (offsets.size() != t.ndim || lengths.size() != t.ndim)
    return Invalid(field, absl::StrFormat("%d offsets and %d lengths, tensor "
                                          "%s has %d dims",
                                          offsets.size(), lengths.size(),
                                          QuotePrefix(t.name), t.ndim));
  for (uint32_t d = 0; d < t.ndim; ++d) {
    if (lengths[d] == 0)
      return Invalid(field, absl::StrFormat("lengths[%d] is 0", d));
    if (offsets[d] > t.global_shape[d] ||
        lengths[d] > t.global_shape[d] - offsets[d])
      return Invalid(
          field,
          absl::StrFormat("offsets[%d] %d + lengths[%d] %d exceed "
                          "global_shape[%d] %d",
                          d, offsets[d], d, lengths[d], d, t.global_shape[d]));
  }
  tensor_of_.push_back(tensor);
  rank_.push_back(rank);
  data_offset_.push_back(data_offset);
  piece_coord_.push_back(coords_.size());
  coords_.insert(coords_.end(), offsets.begin(), offsets.end());
  coords_.insert(coords_.end(), lengths.begin(), lengths.end());
  return absl::OkStatus();
}

absl::StatusOr<LayoutIndex> LayoutIndexBuilder::Finish() && {
  if (world_size_ == 0) return Invalid("world_size", "must be at least 1");
  const uint64_t n = rank_.size();
  // Tensors by name; pieces grouped by tensor (counting sort).
  std::vector<uint32_t> by_name(tensors_.size());
  std::iota(by_name.begin(), by_name.end(), 0);
  std::sort(by_name.begin(), by_name.end(), [&](uint32_t a, uint32_t b) {
    return tensors_[a].name < tensors_[b].name;
  });
  std::vector<uint32_t> new_id(tensors_.size());
  for (uint32_t i = 0; i < by_name.size(); ++i) new_id[by_name[i]] = i;
  LayoutIndex idx;
  idx.world_size_ = world_size_;
  idx.tensors_.reserve(tensors_.size());
  for (uint32_t old : by_name) idx.tensors_.push_back(std::move(tensors_[old]));
  for (uint32_t t : tensor_of_) ++idx.tensors_[new_id[t]].num_pieces;
  uint64_t first = 0, coord = 0;
  for (LayoutTensor& t : idx.tensors_) {
    t.first_piece = first;
    t.coord_base = coord;
    first += t.num_pieces;
    coord += t.num_pieces * 2 * t.ndim;
  }
  std::vector<uint64_t> order(n);
  {
    std::vector<uint64_t> next(idx.tensors_.size());
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = idx.tensors_[i].first_piece;
    for (uint64_t p = 0; p < n; ++p) order[next[new_id[tensor_of_[p]]]++] = p;
  }
  // Within a tensor: along the first dim where offsets differ, then by the
  // whole box and the rank, so replicas of a box are adjacent, by rank.
  for (LayoutTensor& t : idx.tensors_) {
    auto begin = order.begin() + t.first_piece;
    auto end = begin + t.num_pieces;
    const uint32_t nd = t.ndim;
    t.split_dim = 0;
    if (t.num_pieces > 1) {
      const uint64_t* c0 = coords_.data() + piece_coord_[*begin];
      uint32_t d = nd;
      for (auto it = begin + 1; it != end && d > 0; ++it) {
        const uint64_t* c = coords_.data() + piece_coord_[*it];
        for (uint32_t k = 0; k < d; ++k)
          if (c[k] != c0[k]) {
            d = k;
            break;
          }
      }
      t.split_dim = d == nd ? 0 : d;
    }
    const uint32_t sd = t.split_dim;
    auto less = [&](uint64_t a, uint64_t b) {
      const uint64_t* ca = coords_.data() + piece_coord_[a];
      const uint64_t* cb = coords_.data() + piece_coord_[b];
      if (nd > 0 && ca[sd] != cb[sd]) return ca[sd] < cb[sd];
      if (!std::equal(ca, ca + 2 * nd, cb))
        return std::lexicographical_compare(ca, ca + 2 * nd, cb, cb + 2 * nd);
      return rank_[a] < rank_[b];
    };
    if (!std::is_sorted(begin, end, less)) std::sort(begin, end, less);
  }
  idx.tensor_of_.resize(n);
  idx.rank_.resize(n);
  idx.data_offset_.resize(n);
  idx.coords_.resize(coords_.size());
  uint64_t* out = idx.coords_.data();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t p = order[i];
    const uint32_t t = new_id[tensor_of_[p]];
    idx.tensor_of_[i] = t;
    idx.rank_[i] = rank_[p];
    idx.data_offset_[i] = data_offset_[p];
    const uint32_t nd = idx.tensors_[t].ndim;
    std::copy_n(coords_.data() + piece_coord_[p], 2 * nd, out);
    out += 2 * nd;
  }
  return idx;
}

absl::Status ValidateTensorLayout(const v1::TensorMeta& meta,
                                  std::string_view field) {
  auto f = [&](std::string_view name) {
    return absl::StrCat(AV(field), ".", AV(name));
  };
  if (!IsValidDType(meta.dtype()))
    return Invalid(f("dtype"),
                   absl::StrFormat("%d is not a known dtype", meta.dtype()));
  const int nd = meta.shape_size();
  if (nd > static_cast<int>(kMaxTensorDims))
    return Invalid(f("shape"), absl::StrFormat("%d dims, at most %d allowed",
                                               nd, kMaxTensorDims));
  uint64_t bytes;
  if (!BytesOf(std::span<const uint64_t>(meta.shape().data(), nd),
               DTypeSize(static_cast<DType>(meta.dtype())), &bytes))
    return Invalid(f("shape"), "bytes overflow 64 bits");
  if (bytes != meta.bytes())
    return Invalid(f("bytes"),
                   absl::StrFormat("%d, but shape x dtype size is %d",
                                   meta.bytes(), bytes));
  if (meta.global_shape_size() == 0) {
    if (meta.piece_offsets_size() != 0)
      return Invalid(f("piece_offsets"), "set without global_shape");
    if (!meta.global_name().empty())
      return Invalid(f("global_name"), "set without global_shape");
    return absl::OkStatus();
  }
  if (meta.global_shape_size() != nd)
    return Invalid(
        f("global_shape"),
        absl::StrFormat("%d dims, shape has %d", meta.global_shape_size(), nd));
  if (meta.piece_offsets_size() != nd)
    return Invalid(f("piece_offsets"),
                   absl::StrFormat("%d dims, shape has %d",
                                   meta.piece_offsets_size(), nd));
  for (int d = 0; d < nd; ++d) {
    const uint64_t g = meta.global_shape(d), o = meta.piece_offsets(d),
                   l = meta.shape(d);
    if (o > g || l > g - o)
      return Invalid(absl::StrFormat("%s.piece_offsets[%d]", AV(field), d),
                     absl::StrFormat("offset %d + length %d exceed "
                                     "global_shape[%d] %d",
                                     o, l, d, g));
  }
  if (!meta.global_name().empty())
    return ValidateTensorName(meta.global_name(), f("global_name"));
  return absl::OkStatus();
}

absl::Status AddShardPieces(LayoutIndexBuilder& b, uint32_t rank,
                            std::span<const v1::TensorMeta> metas,
                            std::string_view field) {
  std::vector<uint64_t> zeros(kMaxTensorDims, 0);
  for (size_t i = 0; i < metas.size(); ++i) {
    const v1::TensorMeta& m = metas[i];
    const std::string f = absl::StrFormat("%s.tensors[%d]", field, i);
    if (absl::Status s = ValidateTensorLayout(m, f); !s.ok()) return s;
    const bool whole = m.global_shape_size() == 0;
    std::span<const uint64_t> shape(m.shape().data(), m.shape_size());
    std::span<const uint64_t> global =
        whole ? shape
              : std::span<const uint64_t>(m.global_shape().data(),
                                          m.global_shape_size());
    std::span<const uint64_t> offsets =
        whole ? std::span<const uint64_t>(zeros.data(), shape.size())
              : std::span<const uint64_t>(m.piece_offsets().data(),
                                          m.piece_offsets_size());
    const std::string& name =
        m.global_name().empty() ? m.name() : m.global_name();
    absl::StatusOr<uint32_t> t =
        b.AddTensor(name, static_cast<DType>(m.dtype()), global);
    if (!t.ok()) return Invalid(f, std::string(t.status().message()));
    // An empty piece (a zero dimension) holds no byte to read.
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) continue;
    if (absl::Status s = b.AddPiece(*t, rank, m.offset(), offsets, shape, f);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status AddIndexPieces(LayoutIndexBuilder& b, const LayoutIndex& from,
                            uint32_t rank, std::string_view field) {
  for (const LayoutTensor& t : from.tensors()) {
    // Declared even without a piece of `rank`: a tensor two sources
    // declare differently is refused wherever its pieces are.
    const std::string f = std::string(field) + ".tensor " + QuotePrefix(t.name);
    absl::StatusOr<uint32_t> id =
        b.AddTensor(t.name, t.dtype,
                    std::span<const uint64_t>(t.global_shape.data(), t.ndim));
    if (!id.ok()) return Invalid(f, std::string(id.status().message()));
    for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p) {
      if (from.piece_rank(p) != rank) continue;
      const uint64_t* c = from.piece_coords(p);
      if (absl::Status s =
              b.AddPiece(*id, rank, from.piece_data_offset(p),
                         std::span<const uint64_t>(c, t.ndim),
                         std::span<const uint64_t>(c + t.ndim, t.ndim), f);
          !s.ok())
        return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<LayoutIndex> BuildLayoutIndex(
    uint32_t world_size, std::span<const std::vector<v1::TensorMeta>> shards) {
  if (shards.size() != world_size)
    return Invalid("shards", absl::StrFormat("%d rank lists, world_size %d",
                                             shards.size(), world_size));
  LayoutIndexBuilder b(world_size);
  uint64_t pieces = 0;
  for (const auto& s : shards) pieces += s.size();
  b.Reserve(shards.empty() ? 0 : shards[0].size(), pieces);
  for (uint32_t r = 0; r < world_size; ++r)
    CKPT_RETURN_IF_ERROR(
        AddShardPieces(b, r, shards[r], absl::StrFormat("shards[%d]", r)));
  return std::move(b).Finish();
}

}  // namespace ckpt::storage
