#include "storage/reshard_plan.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

// Box with ends instead of lengths, the planner's working form.
struct Span {
  uint32_t ndim = 0;
  uint64_t lo[kMaxTensorDims];
  uint64_t hi[kMaxTensorDims];
};

// From a piece's coordinates (ndim offsets, then ndim lengths).
Span SpanAt(const uint64_t* c, uint32_t ndim) {
  Span s;
  s.ndim = ndim;
  for (uint32_t d = 0; d < s.ndim; ++d) {
    s.lo[d] = c[d];
    s.hi[d] = c[d] + c[s.ndim + d];
  }
  return s;
}

Span SpanOf(const LayoutIndex& idx, uint64_t p) {
  Span s;
  s.ndim = idx.tensors()[idx.piece_tensor(p)].ndim;
  const uint64_t* c = idx.piece_coords(p);
  for (uint32_t d = 0; d < s.ndim; ++d) {
    s.lo[d] = c[d];
    s.hi[d] = c[d] + c[s.ndim + d];
  }
  return s;
}

bool Intersect(const Span& a, const Span& b, Span* out) {
  out->ndim = a.ndim;
  for (uint32_t d = 0; d < a.ndim; ++d) {
    out->lo[d] = std::max(a.lo[d], b.lo[d]);
    out->hi[d] = std::min(a.hi[d], b.hi[d]);
    if (out->lo[d] >= out->hi[d]) return false;
  }
  return true;
}

Box ToBox(const Span& s) {
  Box b;
  b.ndim = s.ndim;
  for (uint32_t d = 0; d < s.ndim; ++d) {
    b.offsets[d] = s.lo[d];
    b.lengths[d] = s.hi[d] - s.lo[d];
  }
  return b;
}

// Appends box - inner (inner inside box) as at most 2 * ndim disjoint boxes.
void Subtract(Span box, const Span& inner, std::vector<Span>* out) {
  for (uint32_t d = 0; d < box.ndim; ++d) {
    if (box.lo[d] < inner.lo[d]) {
      Span part = box;
      part.hi[d] = inner.lo[d];
      out->push_back(part);
      box.lo[d] = inner.lo[d];
    }
    if (inner.hi[d] < box.hi[d]) {
      Span part = box;
      part.lo[d] = inner.hi[d];
      out->push_back(part);
      box.hi[d] = inner.hi[d];
    }
  }
}

std::string Describe(const LayoutTensor& t) {
  return absl::StrFormat(
      "%s [%s]", AV(DTypeName(t.dtype)),
      absl::StrJoin(std::span<const uint64_t>(t.global_shape.data(), t.ndim),
                    ", "));
}

absl::Status CheckSameTensor(const LayoutTensor& s, const LayoutTensor& r) {
  bool same = s.dtype == r.dtype && s.ndim == r.ndim;
  for (uint32_t d = 0; same && d < s.ndim; ++d)
    same = s.global_shape[d] == r.global_shape[d];
  if (same) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("tensor %s: requested as %s, saved as %s",
                      QuotePrefix(r.name), Describe(r), Describe(s)));
}

// Plans the requests of one tensor; scratch vectors are reused across calls.
class TensorPlanner {
 public:
  TensorPlanner(const LayoutIndex& saved, const LayoutIndex& requested,
                const PlanOptions& options,
                absl::FunctionRef<void(const PlannedRead&)> sink)
      : saved_(saved), req_(requested), opt_(options), sink_(sink) {}

  absl::Status Plan(const LayoutTensor& st, const LayoutTensor& rt) {
    read_.box = Box{};
    read_.box.ndim = st.ndim;
    const uint32_t sd = st.split_dim;
    const bool scalar = st.ndim == 0;
    // Running maximum of the saved pieces' ends along the split dimension:
    // the first piece whose running end passes a request's start is the
    // first that can overlap it.
    run_end_.resize(st.num_pieces);
    uint64_t m = 0;
    for (uint64_t i = 0; i < st.num_pieces; ++i) {
      const uint64_t p = st.first_piece + i;
      m = std::max(
          m,
          scalar ? 1 : saved_.piece_offset(p, sd) + saved_.piece_length(p, sd));
      run_end_[i] = m;
    }
    // Replicas of one box are adjacent (the index order): the end of each
    // run, so a request looks at one representative per distinct box.
    same_end_.resize(st.num_pieces);
    for (uint64_t i = st.num_pieces; i-- > 0;) {
      const uint64_t p = st.first_piece + i;
      same_end_[i] =
          i + 1 < st.num_pieces && SameBox(saved_.piece_coords(p),
                                           saved_.piece_coords(p + 1), st.ndim)
              ? same_end_[i + 1]
              : i + 1;
    }
    // Distinct saved boxes that never overlap along the split dimension
    // (row sharding, with or without replicas) are disjoint: a request is
    // then covered exactly when its intersections add up to its volume.
    bool disjoint = !scalar;
    for (uint64_t i = 0, prev_end = 0; disjoint && i < st.num_pieces;
         i = same_end_[i]) {
      const uint64_t p = st.first_piece + i;
      disjoint = i == 0 || saved_.piece_offset(p, sd) >= prev_end;
      prev_end = saved_.piece_offset(p, sd) + saved_.piece_length(p, sd);
    }
    // Coordinates of the tensor's pieces lie in one array, 2 * ndim apart.
    const uint32_t nd = st.ndim, stride = 2 * nd;
    const uint64_t* sc =
        st.num_pieces == 0 ? nullptr : saved_.piece_coords(st.first_piece);
    const uint64_t* rc = req_.piece_coords(rt.first_piece);  // has pieces
    uint64_t j = 0;
    for (uint64_t q = rt.first_piece; q < rt.first_piece + rt.num_pieces; ++q) {
      const Span want = SpanAt(rc + (q - rt.first_piece) * stride, nd);
      const uint64_t a = scalar ? 0 : want.lo[sd], b = scalar ? 1 : want.hi[sd];
      j = Gallop(j, a);
      cands_.clear();
      cuts_.clear();
      const uint32_t rank = req_.piece_rank(q);
      for (uint64_t i = j; i < st.num_pieces; i = same_end_[i]) {
        const uint64_t* c = sc + i * stride;
        if (!scalar && c[sd] >= b) break;
        Span cut;
        if (Intersect(SpanAt(c, nd), want, &cut)) {
          cands_.push_back(
              Choose(st.first_piece + i, st.first_piece + same_end_[i], rank));
          cuts_.push_back(cut);
        }
      }
      if (disjoint && EmitDisjoint(q, want)) continue;
      // Stable insertion sort (few candidates): equal preference keeps the
      // index order.
      for (size_t i = 1; i < cands_.size(); ++i) {
        const Cand c = cands_[i];
        size_t k = i;
        for (; k > 0 && cands_[k - 1].pref > c.pref; --k)
          cands_[k] = cands_[k - 1];
        cands_[k] = c;
      }
      if (absl::Status s = Cover(q, want); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  struct Cand {
    int pref;
    uint64_t piece;
  };

  // Hands the read of `s` from saved piece `piece` into request `q` to the
  // sink. The read is reused: only the tensor's dims are written, the rest
  // stay zero from Plan, so a read costs no clearing of the whole box
  // (which was a quarter of the planner's time).
  void Emit(uint64_t piece, uint64_t q, const Span& s) {
    read_.saved_piece = piece;
    read_.request = q;
    for (uint32_t d = 0; d < s.ndim; ++d) {
      read_.box.offsets[d] = s.lo[d];
      read_.box.lengths[d] = s.hi[d] - s.lo[d];
    }
    sink_(read_);
  }

  static bool SameBox(const uint64_t* a, const uint64_t* b, uint32_t ndim) {
    return std::equal(a, a + 2 * ndim, b);
  }

  // The replica of [first, end) (ranks ascending) to read for `rank`: its
  // own (binary search), else one on its node (a scan of the replicas),
  // else the first.
  Cand Choose(uint64_t first, uint64_t end, uint32_t rank) const {
    uint64_t lo = first, hi = end;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      if (saved_.piece_rank(mid) < rank)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo < end && saved_.piece_rank(lo) == rank) return {0, lo};
    if (!opt_.saved_node.empty())
      for (uint64_t p = first; p < end; ++p)
        if (opt_.saved_node[saved_.piece_rank(p)] == opt_.requested_node[rank])
          return {1, p};
    return {2, first};
  }

  // The first i >= 0 with run_end_[i] > a, searched outward from `from`.
  uint64_t Gallop(uint64_t from, uint64_t a) const {
    const uint64_t n = run_end_.size();
    auto first = run_end_.begin(), last = run_end_.begin() + n;
    if (from < n && run_end_[from] > a) {
      // Back: find a step where the condition fails.
      uint64_t step = 1, hi = from;
      while (hi > 0) {
        const uint64_t lo = hi > step ? hi - step : 0;
        if (run_end_[lo] <= a) {
          first = run_end_.begin() + lo;
          break;
        }
        hi = lo;
        step *= 2;
      }
      last = run_end_.begin() + from + 1;
    } else {
      uint64_t step = 1, lo = std::min(from, n);
      while (lo < n) {
        const uint64_t hi = std::min(n, lo + step);
        if (hi == n || run_end_[hi] > a) {
          first = run_end_.begin() + lo;
          last = run_end_.begin() + hi;
          break;
        }
        lo = hi;
        step *= 2;
      }
      if (lo >= n) return n;
    }
    return std::upper_bound(first, last, a) - run_end_.begin();
  }

  // Emits the candidates' intersections (cuts_) if they cover `want`
  // (candidates known disjoint); false, emitting nothing, on a gap.
  bool EmitDisjoint(uint64_t q, const Span& want) {
    uint64_t volume = 1, covered = 0;
    for (uint32_t d = 0; d < want.ndim; ++d) volume *= want.hi[d] - want.lo[d];
    for (size_t i = 0; i < cands_.size(); ++i) {
      uint64_t v = 1;
      for (uint32_t d = 0; d < want.ndim; ++d)
        v *= cuts_[i].hi[d] - cuts_[i].lo[d];
      covered += v;
    }
    if (covered != volume) return false;
    for (size_t i = 0; i < cands_.size(); ++i)
      Emit(cands_[i].piece, q, cuts_[i]);
    return true;
  }

  absl::Status Cover(uint64_t q, const Span& want) {
    left_.clear();
    left_.push_back(want);
    for (const Cand& c : cands_) {
      if (left_.empty()) break;
      const Span have = SpanOf(saved_, c.piece);
      next_.clear();
      for (const Span& box : left_) {
        Span cut;
        if (!Intersect(box, have, &cut)) {
          next_.push_back(box);
          continue;
        }
        Emit(c.piece, q, cut);
        Subtract(box, cut, &next_);
      }
      left_.swap(next_);
    }
    if (left_.empty()) return absl::OkStatus();
    const LayoutTensor& rt = req_.tensors()[req_.piece_tensor(q)];
    return absl::FailedPreconditionError(absl::StrFormat(
        "tensor %s: region %s asked by rank %d is in no saved piece",
        QuotePrefix(rt.name), ToBox(left_.front()).ToString(),
        req_.piece_rank(q)));
  }

  const LayoutIndex& saved_;
  const LayoutIndex& req_;
  const PlanOptions& opt_;
  absl::FunctionRef<void(const PlannedRead&)> sink_;
  std::vector<uint64_t> run_end_, same_end_;
  std::vector<Cand> cands_;
  std::vector<Span> left_, next_, cuts_;
  PlannedRead read_;
};

}  // namespace

absl::Status PlanReshard(const LayoutIndex& saved, const LayoutIndex& requested,
                         const PlanOptions& options,
                         absl::FunctionRef<void(const PlannedRead&)> sink) {
  return PlanReshardTensors(saved, requested, options, 0,
                            requested.tensors().size(), sink);
}

absl::Status PlanReshardTensors(
    const LayoutIndex& saved, const LayoutIndex& requested,
    const PlanOptions& options, size_t first_tensor, size_t end_tensor,
    absl::FunctionRef<void(const PlannedRead&)> sink) {
  if (!options.saved_node.empty() || !options.requested_node.empty()) {
    if (options.saved_node.size() != saved.world_size())
      return absl::InvalidArgumentError(
          absl::StrFormat("saved_node: %d entries, saved world_size %d",
                          options.saved_node.size(), saved.world_size()));
    if (options.requested_node.size() != requested.world_size())
      return absl::InvalidArgumentError(absl::StrFormat(
          "requested_node: %d entries, requested world_size %d",
          options.requested_node.size(), requested.world_size()));
  }
  TensorPlanner planner(saved, requested, options, sink);
  end_tensor = std::min(end_tensor, requested.tensors().size());
  for (size_t t = first_tensor; t < end_tensor; ++t) {
    const LayoutTensor& rt = requested.tensors()[t];
    if (rt.num_pieces == 0) continue;
    const int64_t s = saved.FindTensor(rt.name);
    if (s < 0)
      return absl::NotFoundError(absl::StrFormat(
          "tensor %s: not in the saved index", QuotePrefix(rt.name)));
    const LayoutTensor& st = saved.tensors()[s];
    if (absl::Status e = CheckSameTensor(st, rt); !e.ok()) return e;
    if (absl::Status e = planner.Plan(st, rt); !e.ok()) return e;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<PlannedRead>>> PlanReshardByRank(
    const LayoutIndex& saved, const LayoutIndex& requested,
    const PlanOptions& options) {
  std::vector<std::vector<PlannedRead>> out(requested.world_size());
  absl::Status s =
      PlanReshard(saved, requested, options, [&](const PlannedRead& r) {
        out[requested.piece_rank(r.request)].push_back(r);
      });
  if (!s.ok()) return s;
  return out;
}

void ForEachByteRun(const LayoutIndex& saved, const LayoutIndex& requested,
                    const PlannedRead& read,
                    absl::FunctionRef<void(uint64_t, uint64_t, uint64_t)> fn) {
  const Box& box = read.box;
  const uint32_t nd = box.ndim;
  const uint64_t elem =
      DTypeSize(saved.tensors()[saved.piece_tensor(read.saved_piece)].dtype);
  const uint64_t* sc = saved.piece_coords(read.saved_piece);
  const uint64_t* dc = requested.piece_coords(read.request);
  // Row-major strides (in bytes) of both pieces.
  uint64_t sstride[kMaxTensorDims], dstride[kMaxTensorDims];
  uint64_t s = elem, d = elem;
  for (uint32_t k = nd; k-- > 0;) {
    sstride[k] = s;
    dstride[k] = d;
    s *= sc[nd + k];
    d *= dc[nd + k];
  }
  // The run spans the trailing dims that the box covers whole in both
  // pieces, plus the first dim before them.
  uint32_t inner = nd;
  uint64_t run = elem;
  while (inner > 0) {
    const uint32_t k = inner - 1;
    run *= box.lengths[k];
    inner = k;
    if (box.lengths[k] != sc[nd + k] || box.lengths[k] != dc[nd + k]) break;
  }
  uint64_t idx[kMaxTensorDims] = {};
  for (;;) {
    uint64_t so = 0, dof = 0;
    for (uint32_t k = 0; k < nd; ++k) {
      const uint64_t g = box.offsets[k] + (k < inner ? idx[k] : 0);
      so += (g - sc[k]) * sstride[k];
      dof += (g - dc[k]) * dstride[k];
    }
    fn(so, dof, run);
    int k = static_cast<int>(inner) - 1;
    for (; k >= 0; --k) {
      if (++idx[k] < box.lengths[k]) break;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

}  // namespace ckpt::storage
