#include "storage/layout_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/checksum.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

void PutVarint(std::string* out, uint64_t v) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}

void PutFixed(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> 8 * i));
}

uint64_t GetFixed(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(p[i])} << 8 * i;
  return v;
}

// Reads the body; each error names the item being read.
class Reader {
 public:
  explicit Reader(std::string_view body)
      : p_(body.data()), end_(p_ + body.size()) {}
  uint64_t left() const { return end_ - p_; }

  // The next varint, or why there is none (a string literal).
  const char* Next(uint64_t* v) {
    if (p_ != end_ && static_cast<uint8_t>(*p_) < 0x80) {
      *v = static_cast<uint8_t>(*p_++);
      return nullptr;
    }
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return "truncated";
      const uint8_t b = static_cast<uint8_t>(*p_++);
      if (shift == 63 && b > 1) return "varint overflows 64 bits";
      r |= uint64_t{b & 0x7fu} << shift;
      if (b < 0x80) {
        // One encoding per value keeps the index canonical.
        if (b == 0) return "varint not minimal";
        *v = r;
        return nullptr;
      }
    }
    return "varint longer than 10 bytes";
  }
  absl::Status Varint(std::string_view what, uint64_t* v) {
    if (const char* why = Next(v)) return Error(what, why);
    return absl::OkStatus();
  }
  absl::Status Bytes(std::string_view what, uint64_t n, std::string_view* out) {
    if (n > left()) return Error(what, "truncated");
    *out = std::string_view(p_, n);
    p_ += n;
    return absl::OkStatus();
  }
  static absl::Status Error(std::string_view what, std::string_view why) {
    return absl::DataLossError(
        absl::StrCat("layout index: ", AV(what), ": ", AV(why)));
  }

 private:
  const char* p_;
  const char* end_;
};

template <typename T>
void Grow(std::vector<T>* v, size_t n) {
  if (n > v->capacity()) v->reserve(std::max(n, 2 * v->capacity()));
}

}  // namespace

std::string SerializeLayoutIndex(const LayoutIndex& index) {
  std::string out(kLayoutIndexMagic, 4);
  PutFixed(&out, kLayoutIndexVersion, 4);
  PutVarint(&out, index.world_size());
  PutVarint(&out, index.tensors().size());
  for (const LayoutTensor& t : index.tensors()) {
    PutVarint(&out, t.name.size());
    out += t.name;
    PutVarint(&out, static_cast<uint32_t>(t.dtype));
    PutVarint(&out, t.ndim);
    for (uint32_t d = 0; d < t.ndim; ++d) PutVarint(&out, t.global_shape[d]);
    PutVarint(&out, t.split_dim);
    PutVarint(&out, t.num_pieces);
    for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces; ++p) {
      PutVarint(&out, index.piece_rank(p));
      PutVarint(&out, index.piece_data_offset(p));
      const uint64_t* c = index.piece_coords(p);
      for (uint32_t k = 0; k < 2 * t.ndim; ++k) PutVarint(&out, c[k]);
    }
  }
  PutFixed(&out, Hash64(out.data(), out.size()), 8);
  return out;
}

absl::StatusOr<LayoutIndex> ParseLayoutIndex(std::string_view bytes) {
  if (bytes.size() < 16)
    return Reader::Error(
        "size", absl::StrFormat("%d bytes, at least 16 needed", bytes.size()));
  if (std::memcmp(bytes.data(), kLayoutIndexMagic, 4) != 0)
    return Reader::Error("magic", "not \"CKLI\"");
  if (const uint64_t v = GetFixed(bytes.data() + 4, 4);
      v != kLayoutIndexVersion)
    return Reader::Error("version", absl::StrFormat("%d, this build reads %d",
                                                    v, kLayoutIndexVersion));
  const size_t n = bytes.size();
  if (GetFixed(bytes.data() + n - 8, 8) != Hash64(bytes.data(), n - 8))
    return Reader::Error("checksum", "mismatch (corrupted or truncated)");
  Reader r(bytes.substr(8, n - 16));
  LayoutIndex idx;
  uint64_t world, count;
  if (absl::Status s = r.Varint("world_size", &world); !s.ok()) return s;
  if (world == 0 || world > UINT32_MAX)
    return Reader::Error("world_size",
                         absl::StrFormat("%d, must be 1 to 2^32-1", world));
  idx.world_size_ = world;
  if (absl::Status s = r.Varint("tensor_count", &count); !s.ok()) return s;
  // A tensor takes at least 5 bytes: never reserve more than the input holds.
  if (count > r.left() / 5 || count > UINT32_MAX)
    return Reader::Error(
        "tensor_count",
        absl::StrFormat("%d, more than the bytes left hold", count));
  idx.tensors_.reserve(count);
  uint64_t first = 0;
  for (uint64_t ti = 0; ti < count; ++ti) {
    // Field names are built only for an error: a step's index has a tensor
    // entry per tensor, a merge parses one per tensor per rank.
    std::string_view name;
    bool named = false;  // errors name the tensor once its name is valid
    auto what = [&] {
      return named ? absl::StrFormat("tensors[%d] %s", ti, QuotePrefix(name))
                   : absl::StrFormat("tensors[%d]", ti);
    };
    auto fail = [&](std::string_view f, std::string_view why) {
      return Reader::Error(absl::StrCat(what(), ".", AV(f)), why);
    };
    uint64_t len, v;
    if (const char* why = r.Next(&len)) return fail("name_len", why);
    if (len > r.left()) return fail("name", "truncated");
    if (absl::Status s = r.Bytes("name", len, &name); !s.ok()) return s;
    if (!ValidateTensorName(name, "name").ok()) {
      const absl::Status s =
          ValidateTensorName(name, absl::StrCat(what(), ".name"));
      return absl::DataLossError(absl::StrCat("layout index: ", s.message()));
    }
    if (!idx.tensors_.empty() && !(idx.tensors_.back().name < name))
      return fail("name", "not after the previous name");
    named = true;
    LayoutTensor t;
    t.name = std::string(name);
    if (const char* why = r.Next(&v)) return fail("dtype", why);
    if (v > UINT32_MAX || !IsValidDType(static_cast<uint32_t>(v)))
      return fail("dtype", absl::StrCat(v, " is not a dtype"));
    t.dtype = static_cast<DType>(v);
    if (const char* why = r.Next(&v)) return fail("ndim", why);
    if (v > kMaxTensorDims)
      return fail("ndim", absl::StrFormat("%d, at most %d", v, kMaxTensorDims));
    t.ndim = v;
    uint64_t elems = DTypeSize(t.dtype);
    for (uint32_t d = 0; d < t.ndim; ++d) {
      auto f = [d] { return absl::StrCat("global_shape[", d, "]"); };
      if (const char* why = r.Next(&t.global_shape[d])) return fail(f(), why);
      const uint64_t g = t.global_shape[d];
      if (g != 0 && elems > UINT64_MAX / g)
        return fail(f(), "bytes overflow 64 bits");
      elems *= g;
    }
    if (const char* why = r.Next(&v)) return fail("split_dim", why);
    if (v >= std::max<uint32_t>(t.ndim, 1))
      return fail("split_dim",
                  absl::StrFormat("%d, tensor has %d dims", v, t.ndim));
    t.split_dim = v;
    if (const char* why = r.Next(&v)) return fail("piece_count", why);
    if (v > r.left() / (2 + 2 * t.ndim))
      return fail("piece_count",
                  absl::StrFormat("%d, more than the bytes left hold", v));
    t.first_piece = first;
    t.num_pieces = v;
    t.coord_base = idx.coords_.size();
    first += v;
    const uint32_t tid = idx.tensors_.size();
    idx.tensor_of_.insert(idx.tensor_of_.end(), v, tid);
    // Geometric growth: an exact reserve per tensor would copy the arrays
    // once per tensor.
    Grow(&idx.rank_, first);
    Grow(&idx.data_offset_, first);
    Grow(&idx.coords_, t.coord_base + v * 2 * t.ndim);
    // Field names are built only for an error: this loop runs per piece.
    auto piece_error = [&](uint64_t pi, const std::string& f,
                           std::string_view why) {
      return Reader::Error(absl::StrFormat("%s piece %d.%s", what(), pi, f),
                           why);
    };
    auto coord_name = [&](uint32_t k) {
      return k < t.ndim ? absl::StrCat("offsets[", k, "]")
                        : absl::StrCat("lengths[", k - t.ndim, "]");
    };
    for (uint64_t pi = 0; pi < t.num_pieces; ++pi) {
      uint64_t rank, off;
      if (const char* why = r.Next(&rank)) return piece_error(pi, "rank", why);
      if (rank >= world)
        return piece_error(
            pi, "rank", absl::StrFormat("%d, world_size is %d", rank, world));
      if (const char* why = r.Next(&off))
        return piece_error(pi, "data_offset", why);
      idx.rank_.push_back(rank);
      idx.data_offset_.push_back(off);
      const size_t base = idx.coords_.size();
      for (uint32_t k = 0; k < 2 * t.ndim; ++k) {
        if (const char* why = r.Next(&v))
          return piece_error(pi, coord_name(k), why);
        idx.coords_.push_back(v);
      }
      for (uint32_t d = 0; d < t.ndim; ++d) {
        const uint64_t o = idx.coords_[base + d],
                       l = idx.coords_[base + t.ndim + d];
        if (l == 0) return piece_error(pi, coord_name(t.ndim + d), "is 0");
        if (o > t.global_shape[d] || l > t.global_shape[d] - o)
          return piece_error(
              pi, coord_name(d),
              absl::StrFormat("%d + length %d exceed global_shape[%d] %d", o, l,
                              d, t.global_shape[d]));
      }
      // The index order: along split_dim, then box, then rank (replicas of
      // a box, scalars included, by rank: the planner searches them).
      if (pi > 0) {
        const uint64_t* c = idx.coords_.data() + base;
        const uint64_t* prev = c - 2 * t.ndim;
        const uint32_t sd = t.split_dim;
        bool less;
        if (t.ndim > 0 && c[sd] != prev[sd])
          less = c[sd] < prev[sd];
        else if (!std::equal(c, c + 2 * t.ndim, prev))
          less = std::lexicographical_compare(c, c + 2 * t.ndim, prev,
                                              prev + 2 * t.ndim);
        else
          less = rank < idx.rank_[idx.rank_.size() - 2];
        if (less) return piece_error(pi, "offsets", "not in index order");
      }
    }
    idx.tensors_.push_back(std::move(t));
  }
  if (r.left() != 0)
    return Reader::Error("body", absl::StrFormat("%d bytes after the last "
                                                 "tensor",
                                                 r.left()));
  return idx;
}

}  // namespace ckpt::storage
