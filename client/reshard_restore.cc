// Restore into another layout (doc/resharding.md, "Restore into another
// layout"): the tensors asked for are pieces (or wholes) of the saved
// global tensors at places this rank did not save. The client gets the
// step's layout index from its ckptd (LayoutIndex), plans with the
// planner (own rank first, then the saved ranks this node holds), opens
// each saved rank it needs once, one at a time (OpenRestore with
// saved_rank: the daemon serves it from memory, or loads it from disk or
// the object tier into a slot, or names the file this process may read),
// and copies the byte runs from the slot straight into the tensors. From a
// file, the touched chunks go through the FileRestorer's pipeline of a
// same-layout restore (io_uring, O_DIRECT, reads in flight, each chunk
// hashed as it lands, read straight into the tensor when a chunk lies
// whole inside one run), and the rest of each run is copied out of its
// chunk while that is in memory.
//
// Verification: a tensor's checksum is XXH3 of its 1 MiB chunk hashes.
// When the save's chunk hashes came with the index entry and combine into
// the checksum, only the chunks a run touches are read and hashed, each
// against its own hash; otherwise every chunk of the piece, against the
// checksum. Chunks that lie whole inside one run to a host tensor are
// copied and hashed in one pass (CopyAndHash, as a same-layout restore
// does); the other hashed chunks are hashed in place and their runs copied
// besides. A piece that fails is reported as a bad copy (the daemon checks
// it and serves the next copy of that saved rank, whose runs are then
// copied again).
#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/client_impl.h"
#include "client/file_restore.h"
#include "client/tensor_check.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/reshard_plan.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt {
namespace {

// Ranges one OpenRestore may name (the daemon's limit, ranged_read.h).
constexpr size_t kMaxOpenRanges = 65536;

// One run of bytes of a saved piece to a requested tensor.
struct Run {
  uint64_t src = 0;  // offset in the saved piece
  char* dst = nullptr;
  uint64_t bytes = 0;
  int device = -1;  // -1: dst is host memory
};

// The requested place of tensors[i]: the global tensor's name, its shape
// and the piece's offsets.
struct Place {
  std::string name;
  std::vector<uint64_t> global, offsets;
};

Place PlaceOf(const Tensor& t, const v1::TensorMeta* own) {
  Place p;
  auto u64 = [](const std::vector<int64_t>& v) {
    return std::vector<uint64_t>(v.begin(), v.end());
  };
  if (t.layout && !t.layout->global_shape.empty()) {
    p.name = t.layout->global_name.empty() ? t.name : t.layout->global_name;
    p.global = u64(t.layout->global_shape);
    p.offsets = u64(t.layout->offsets);
  } else if (own != nullptr && own->global_shape_size() != 0) {
    // Asked by its piece name without a layout: the piece this rank saved
    // under that name (the same place a same-layout restore fills).
    p.name = own->global_name().empty() ? own->name() : own->global_name();
    p.global.assign(own->global_shape().begin(), own->global_shape().end());
    p.offsets.assign(own->piece_offsets().begin(), own->piece_offsets().end());
  } else {
    p.name = t.name;
    p.global = u64(t.shape);
    p.offsets.assign(t.shape.size(), 0);
  }
  return p;
}

// The save's chunk hashes of a piece are usable when there is one per
// chunk and they combine into its checksum (so each one is as trusted as
// the checksum). A piece of one chunk gains nothing from them.
bool ChunkHashesUsable(const v1::TensorMeta& m) {
  const uint64_t chunks = ChecksumChunks(m.bytes());
  if (!m.has_checksum() || chunks < 2 ||
      static_cast<uint64_t>(m.chunk_hashes_size()) != chunks)
    return false;
  return CombineChunkHashes(std::span<const uint64_t>(
             m.chunk_hashes().data(), m.chunk_hashes_size())) == m.checksum();
}

}  // namespace

absl::Status Client::Impl::RestoreResharded(
    int64_t step, std::span<const Tensor> tensors,
    std::span<const v1::TensorMeta> own_metas,
    std::vector<std::optional<TensorLayout>>* layouts, RestoreStats* stats) {
  const std::string what =
      absl::StrCat("restore of step ", step, " into another layout");
  std::lock_guard<std::mutex> serial(reshard_mu_);
  v1::LayoutIndexRequest ireq;
  ireq.set_job(options_.job);
  ireq.set_step(static_cast<uint64_t>(step));
  CKPT_ASSIGN_OR_RETURN(v1::LayoutIndexResponse iresp,
                        stub_->LayoutIndex(ireq));
  absl::StatusOr<storage::LayoutIndex> saved =
      storage::ParseLayoutIndex(iresp.index());
  if (!saved.ok()) return Annotate(saved.status(), what);
  if (saved->world_size() != iresp.world_size())
    return absl::DataLossError(
        absl::StrCat(what, ": LayoutIndex: world_size ", iresp.world_size(),
                     ", its index says ", saved->world_size()));
  const uint32_t saved_ws = saved->world_size();

  // The requested pieces as an index of the new world size: this rank's
  // pieces only, each piece's data offset its tensor's position.
  std::unordered_map<std::string_view, const v1::TensorMeta*> own;
  for (const v1::TensorMeta& m : own_metas) own.emplace(m.name(), &m);
  const uint32_t me = static_cast<uint32_t>(options_.rank);
  const uint32_t new_ws =
      std::max<uint32_t>(static_cast<uint32_t>(options_.world_size), me + 1);
  storage::LayoutIndexBuilder rb(new_ws);
  std::vector<Place> places(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string label = client::TensorLabel(tensors, i);
    auto o = own.find(t.name);
    places[i] = PlaceOf(t, o == own.end() ? nullptr : o->second);
    const Place& p = places[i];
    const int64_t st = saved->FindTensor(p.name);
    if (st < 0)
      return absl::NotFoundError(absl::StrCat(
          what, ": ", label, ": not in the checkpoint (no saved piece of ",
          QuotePrefix(p.name), ")"));
    std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
    absl::StatusOr<uint32_t> id = rb.AddTensor(p.name, t.dtype, p.global);
    if (!id.ok()) return Annotate(id.status(), absl::StrCat(what, ": ", label));
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) continue;
    if (absl::Status s =
            rb.AddPiece(*id, me, i, p.offsets, shape, absl::StrCat(label));
        !s.ok())
      return Annotate(s, what);
  }
  absl::StatusOr<storage::LayoutIndex> requested = std::move(rb).Finish();
  if (!requested.ok()) return Annotate(requested.status(), what);

  // Plan: this rank's own pieces first, then those of the saved ranks this
  // node holds (node 0 below), then any.
  std::vector<uint32_t> saved_node(saved_ws), requested_node(new_ws, 0);
  for (uint32_t r = 0; r < saved_ws; ++r) saved_node[r] = r + 1;
  for (uint32_t r : iresp.local_ranks()) {
    if (r >= saved_ws)
      return absl::DataLossError(absl::StrCat(
          what, ": LayoutIndex: local rank ", r, " of world_size ", saved_ws));
    saved_node[r] = 0;
  }
  storage::PlanOptions po;
  po.saved_node = saved_node;
  po.requested_node = requested_node;
  std::vector<storage::PlannedRead> reads;
  CKPT_RETURN_IF_ERROR(
      Annotate(storage::PlanReshard(
                   *saved, *requested, po,
                   [&](const storage::PlannedRead& r) { reads.push_back(r); }),
               what));
  // By saved rank (own rank first), then by saved piece.
  auto rank_key = [&](uint64_t piece) {
    const uint32_t r = saved->piece_rank(piece);
    return r == me ? 0ull : static_cast<uint64_t>(r) + 1;
  };
  std::sort(reads.begin(), reads.end(),
            [&](const storage::PlannedRead& a, const storage::PlannedRead& b) {
              const uint64_t ka = rank_key(a.saved_piece),
                             kb = rank_key(b.saved_piece);
              return ka != kb ? ka < kb : a.saved_piece < b.saved_piece;
            });

  // Per saved rank, the byte ranges of its image the runs read, widened
  // to the 1 MiB checksum chunks of their piece and merged (at most one
  // range per touched chunk): what a ranged fetch from a peer moves.
  std::unordered_map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>>
      ranges;
  for (const storage::PlannedRead& rd : reads) {
    const uint64_t sp = rd.saved_piece;
    const storage::LayoutTensor& lt = saved->tensors()[saved->piece_tensor(sp)];
    uint64_t piece_bytes = DTypeSize(lt.dtype);
    for (uint32_t d = 0; d < lt.ndim; ++d)
      piece_bytes *= saved->piece_length(sp, d);
    const uint64_t at = saved->piece_data_offset(sp);
    auto& v = ranges[saved->piece_rank(sp)];
    storage::ForEachByteRun(
        *saved, *requested, rd, [&](uint64_t so, uint64_t, uint64_t len) {
          const uint64_t a = so / kChecksumChunk * kChecksumChunk;
          const uint64_t b =
              std::min(piece_bytes, (so + len + kChecksumChunk - 1) /
                                        kChecksumChunk * kChecksumChunk);
          v.emplace_back(at + a, at + b);
        });
  }
  for (auto& [r, v] : ranges) {
    std::sort(v.begin(), v.end());
    size_t n = 0;
    for (const auto& x : v)
      if (n > 0 && x.first <= v[n - 1].second)
        v[n - 1].second = std::max(v[n - 1].second, x.second);
      else
        v[n++] = x;
    v.resize(n);
    if (v.size() > kMaxOpenRanges) v.clear();  // too many: the whole rank
  }

  // Saved ranks this node's ckptd does not hold (only another node's
  // manifest describes them, e.g. the ranks of a lost node): the daemon
  // fetches the chunks the runs read from a peer's memory, or loads the
  // whole rank (from a peer, the shared root, then the object tier) when
  // it is opened. They are opened here first, and held open until their
  // runs are copied, so that one that cannot be had is refused before any
  // byte moves.
  std::unordered_map<uint32_t, v1::OpenRestoreResponse> away_open;
  auto close_away = [&] {
    for (auto& [r, resp] : away_open)
      (void)CloseLease(r, static_cast<uint64_t>(step), resp.lease(),
                       absl::OkStatus());
    away_open.clear();
  };
  {
    std::vector<bool> here(saved_ws, false);
    for (uint32_t r : iresp.local_ranks()) here[r] = true;
    std::vector<uint32_t> away;
    for (const storage::PlannedRead& rd : reads) {
      const uint32_t r = saved->piece_rank(rd.saved_piece);
      if (!here[r] && (away.empty() || away.back() != r)) away.push_back(r);
    }
    for (uint32_t r : away) {
      v1::OpenRestoreRequest open = SavedRankOpen(step, r, ranges[r]);
      absl::StatusOr<v1::OpenRestoreResponse> resp = stub_->OpenRestore(open);
      if (!resp.ok()) {
        close_away();
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": saved rank ", r,
            " holds pieces asked for, is not on this node, and this node's "
            "ckptd could not load it (",
            resp.status().message(), ")"));
      }
      away_open.emplace(r, std::move(*resp));
    }
  }
  // Every tensor is now known to be covered: from here on bytes move.
  for (size_t first = 0; first < reads.size();) {
    const uint32_t r = saved->piece_rank(reads[first].saved_piece);
    size_t end = first;
    while (end < reads.size() && saved->piece_rank(reads[end].saved_piece) == r)
      ++end;
    std::span<const storage::PlannedRead> rank_reads(reads.data() + first,
                                                     end - first);
    // The fallback ladder per saved rank: a copy that fails verification
    // is reported bad, the daemon serves the next one (memory, file,
    // object), and this rank's runs are copied again from it.
    std::vector<std::string> tried;
    absl::Status s;
    std::optional<v1::OpenRestoreResponse> pre;
    if (auto it = away_open.find(r); it != away_open.end()) {
      pre = std::move(it->second);
      away_open.erase(it);
    }
    for (int copy = 0; copy < 3; ++copy) {
      bool opened = false;
      s = RestoreSavedRankRuns(step, r, ranges[r], *saved, *requested,
                               rank_reads, tensors, &opened,
                               copy == 0 && pre ? &*pre : nullptr, stats);
      if (s.ok() || !opened || s.code() != absl::StatusCode::kDataLoss) break;
      tried.emplace_back(s.message());
    }
    if (!s.ok()) {
      close_away();
      const std::string copies =
          tried.empty()
              ? std::string(s.message())
              : absl::StrCat("no copy verifies; tried ",
                             absl::StrJoin(tried, "; then "),
                             tried.back() == s.message()
                                 ? ""
                                 : absl::StrCat("; then ", s.message()));
      // The tensors hold whatever was copied before the failure: say so.
      return absl::Status(
          s.code(), absl::StrCat(what, ": saved rank ", r, ": ", copies, " ",
                                 client::kPartlyWritten));
    }
    first = end;
  }
  if (layouts != nullptr) {
    // After a resharding restore: the place each tensor was filled at.
    layouts->clear();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Place& p = places[i];
      if (!tensors[i].layout && p.global.size() == tensors[i].shape.size() &&
          std::equal(p.global.begin(), p.global.end(),
                     tensors[i].shape.begin()) &&
          p.name == tensors[i].name) {
        layouts->push_back(std::nullopt);
        continue;
      }
      TensorLayout l;
      l.global_shape.assign(p.global.begin(), p.global.end());
      l.offsets.assign(p.offsets.begin(), p.offsets.end());
      l.global_name = p.name == tensors[i].name ? "" : p.name;
      layouts->push_back(std::move(l));
    }
  }
  return absl::OkStatus();
}

v1::OpenRestoreRequest Client::Impl::SavedRankOpen(
    int64_t step, uint32_t saved_rank,
    std::span<const std::pair<uint64_t, uint64_t>> ranges) const {
  v1::OpenRestoreRequest open;
  open.set_job(options_.job);
  open.set_rank(static_cast<uint32_t>(options_.rank));
  open.set_step(static_cast<uint64_t>(step));
  open.set_saved_rank(saved_rank);
  // A file this process may read is read piece by piece; anything else
  // comes in a slot.
  open.set_allow_file_read(true);
  // A saved rank the daemon fetches from a peer: only these ranges.
  for (const auto& [a, b] : ranges) {
    open.add_range_offsets(a);
    open.add_range_lengths(b - a);
  }
  return open;
}

absl::Status Client::Impl::RestoreSavedRankRuns(
    int64_t step, uint32_t saved_rank,
    std::span<const std::pair<uint64_t, uint64_t>> ranges,
    const storage::LayoutIndex& saved, const storage::LayoutIndex& requested,
    std::span<const storage::PlannedRead> reads,
    std::span<const Tensor> tensors, bool* opened,
    const v1::OpenRestoreResponse* pre, RestoreStats* stats) {
  v1::OpenRestoreResponse resp;
  if (pre != nullptr) {
    resp = *pre;
  } else {
    CKPT_ASSIGN_OR_RETURN(
        resp, stub_->OpenRestore(SavedRankOpen(step, saved_rank, ranges)));
  }
  *opened = true;
  ++stats->saved_ranks;
  absl::Status s = [&]() -> absl::Status {
    if (resp.source() == v1::RESTORE_SOURCE_FILE) {
      SavedSource src;
      src.path = resp.path();
      return CopyRuns(resp, src, saved_rank, saved, requested, reads, tensors,
                      stats);
    }
    if (resp.shm_name().empty())
      return absl::InternalError("OpenRestore: answered without a slot");
    CKPT_ASSIGN_OR_RETURN(SlotImage slot, MapSlotImage(resp));
    SavedSource src;
    src.image = slot.image;
    return CopyRuns(resp, src, saved_rank, saved, requested, reads, tensors,
                    stats);
  }();
  return CloseLease(saved_rank, static_cast<uint64_t>(step), resp.lease(),
                    std::move(s));
}

absl::Status Client::Impl::CopyRuns(const v1::OpenRestoreResponse& resp,
                                    const SavedSource& src, uint32_t saved_rank,
                                    const storage::LayoutIndex& saved,
                                    const storage::LayoutIndex& requested,
                                    std::span<const storage::PlannedRead> reads,
                                    std::span<const Tensor> tensors,
                                    RestoreStats* stats) {
  // The shard's entries by offset: the index names a piece by its rank and
  // data offset. Each piece read is checked against its entry (name,
  // dtype, shape, place), so an index that disagrees with the shard copies
  // nothing.
  std::unordered_map<uint64_t, const v1::TensorMeta*> by_offset;
  for (const v1::TensorMeta& m : resp.tensors())
    if (m.bytes() != 0) by_offset.emplace(m.offset(), &m);

  struct SavedPiece {
    const v1::TensorMeta* meta = nullptr;
    bool by_chunk = false;         // checked chunk by chunk (else whole)
    size_t first = 0;              // its chunks' entries in `chunks`, from here
    std::vector<uint64_t> chunks;  // which chunk of the piece each entry is
  };
  // Every touched chunk of every saved piece read: its bytes in the image,
  // and the host memory they are copied to while hashed (a chunk that lies
  // whole inside one run), else null (only hashed).
  struct Chunk {
    uint64_t at = 0;
    uint64_t bytes = 0;
    char* dst = nullptr;
  };
  // What else is copied out of a touched chunk: a part of a run, at `at`
  // in the chunk, to host memory (device < 0) or by DMA to a device.
  struct Part {
    size_t chunk = 0;
    uint64_t at = 0;
    char* dst = nullptr;
    uint64_t bytes = 0;
    int device = -1;
  };
  std::vector<SavedPiece> used;
  std::vector<Chunk> chunks;
  std::vector<Part> parts;
  std::vector<bool> touched;
  std::vector<Run> runs, device_runs;
  std::vector<int64_t> chunk_run;
  std::vector<size_t> entry;
  for (size_t i = 0; i < reads.size();) {
    const uint64_t sp = reads[i].saved_piece;
    const storage::LayoutTensor& lt = saved.tensors()[saved.piece_tensor(sp)];
    const uint64_t elem = DTypeSize(lt.dtype);
    auto it = by_offset.find(saved.piece_data_offset(sp));
    const v1::TensorMeta* m = it == by_offset.end() ? nullptr : it->second;
    // The entry must be the piece the index lists.
    bool same = m != nullptr && m->dtype() == static_cast<uint32_t>(lt.dtype) &&
                static_cast<uint32_t>(m->shape_size()) == lt.ndim;
    uint64_t n = elem;
    for (uint32_t d = 0; same && d < lt.ndim; ++d) {
      const uint64_t len = saved.piece_length(sp, d);
      n *= len;
      same = m->shape(static_cast<int>(d)) == len;
      if (m->global_shape_size() == 0)
        same =
            same && saved.piece_offset(sp, d) == 0 && lt.global_shape[d] == len;
      else
        same =
            same && m->global_shape_size() == m->shape_size() &&
            m->piece_offsets_size() == m->shape_size() &&
            m->global_shape(static_cast<int>(d)) == lt.global_shape[d] &&
            m->piece_offsets(static_cast<int>(d)) == saved.piece_offset(sp, d);
    }
    if (same)
      same = (m->global_name().empty() ? m->name() : m->global_name()) ==
                 lt.name &&
             m->bytes() == n && m->offset() <= resp.image_bytes() &&
             resp.image_bytes() - m->offset() >= m->bytes();
    if (!same)
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", QuotePrefix(lt.name), " piece ",
                       saved.PieceBox(sp).ToString(), " of saved rank ",
                       saved_rank, ": the shard has no such entry at offset ",
                       saved.piece_data_offset(sp),
                       " (the layout index and the shard ", "disagree)"));
    // Every run of this saved piece, in source order.
    runs.clear();
    device_runs.clear();
    for (; i < reads.size() && reads[i].saved_piece == sp; ++i) {
      const storage::PlannedRead& rd = reads[i];
      const size_t ti = requested.piece_data_offset(rd.request);
      const Tensor& t = tensors[ti];
      storage::ForEachByteRun(
          saved, requested, rd, [&](uint64_t so, uint64_t dof, uint64_t len) {
            Run r{so, static_cast<char*>(t.data) + dof, len,
                  t.device.is_host() ? -1 : t.device.index};
            (r.device < 0 ? runs : device_runs).push_back(r);
          });
    }
    std::sort(runs.begin(), runs.end(),
              [](const Run& a, const Run& b) { return a.src < b.src; });
    const uint64_t bytes = m->bytes();
    const uint64_t nchunks = ChecksumChunks(bytes);
    auto chunk_end = [&](uint64_t c) {
      return std::min(bytes, (c + 1) * kChecksumChunk);
    };
    // With the save's chunk hashes (consistent with the piece's checksum),
    // only the chunks a run touches are read and hashed, each against its
    // own hash; without them, every chunk, against the checksum.
    const bool by_chunk = ChunkHashesUsable(*m);
    touched.assign(nchunks, !by_chunk);
    if (by_chunk) {
      for (const std::vector<Run>* v : {&runs, &device_runs})
        for (const Run& r : *v)
          for (uint64_t c = r.src / kChecksumChunk;
               c < nchunks && c * kChecksumChunk < r.src + r.bytes; ++c)
            touched[c] = true;
    }
    // Chunks that lie whole inside a host run are copied and hashed in one
    // pass (from a file, read straight into the run's memory when it is
    // aligned); the other touched ones are only hashed.
    chunk_run.assign(nchunks, -1);
    for (size_t k = 0; k < runs.size(); ++k) {
      const Run& r = runs[k];
      for (uint64_t c = (r.src + kChecksumChunk - 1) / kChecksumChunk;
           c < nchunks && chunk_end(c) <= r.src + r.bytes; ++c)
        if (chunk_run[c] < 0) chunk_run[c] = static_cast<int64_t>(k);
    }
    SavedPiece u{m, by_chunk, chunks.size(), {}};
    entry.assign(nchunks, SIZE_MAX);
    for (uint64_t c = 0; c < nchunks; ++c) {
      if (!touched[c]) continue;
      const uint64_t off = c * kChecksumChunk;
      char* dst = nullptr;
      if (chunk_run[c] >= 0) {
        const Run& r = runs[static_cast<size_t>(chunk_run[c])];
        dst = r.dst + (off - r.src);
      }
      entry[c] = chunks.size();
      chunks.push_back({m->offset() + off, chunk_end(c) - off, dst});
      u.chunks.push_back(c);
    }
    used.push_back(std::move(u));
    // What the fused chunks leave of each run, split at chunk boundaries:
    // copied besides.
    for (const std::vector<Run>* v : {&runs, &device_runs})
      for (size_t k = 0; k < v->size(); ++k) {
        const Run& r = (*v)[k];
        for (uint64_t pos = r.src; pos < r.src + r.bytes;) {
          const uint64_t c = pos / kChecksumChunk;
          const uint64_t e = std::min(r.src + r.bytes, chunk_end(c));
          if (!(r.device < 0 && chunk_run[c] == static_cast<int64_t>(k) &&
                pos == c * kChecksumChunk))
            parts.push_back({entry[c], pos - c * kChecksumChunk,
                             r.dst + (pos - r.src), e - pos, r.device});
          pos = e;
        }
      }
  }
  // Parts by chunk: part_first[k] .. part_first[k + 1] are chunk k's.
  std::stable_sort(
      parts.begin(), parts.end(),
      [](const Part& a, const Part& b) { return a.chunk < b.chunk; });
  std::vector<size_t> part_first(chunks.size() + 1, 0);
  for (const Part& p : parts) ++part_first[p.chunk + 1];
  for (size_t k = 0; k < chunks.size(); ++k) part_first[k + 1] += part_first[k];

  // Only the touched chunks are read (copied or hashed), from either
  // source.
  for (const Chunk& c : chunks) stats->bytes_read += c.bytes;
  std::vector<uint64_t> hashes(chunks.size());
  if (src.image != nullptr) {
    // From a slot: the touched chunks (copied to their run while hashed)
    // and the host parts on the copy engine, device parts by DMA.
    std::vector<client::CopyRegion> regions;
    regions.reserve(chunks.size() + parts.size());
    for (const Chunk& c : chunks)
      regions.push_back({src.image + c.at, c.dst, c.bytes});
    absl::Status s;
    std::unique_ptr<client::DeviceCopyBatch> dma;
    for (const Part& p : parts) {
      const char* from = src.image + chunks[p.chunk].at + p.at;
      if (p.device < 0) {
        regions.push_back({from, p.dst, p.bytes});
        continue;
      }
      if (!s.ok()) continue;
      if (!dma) dma = devices_->NewBatch();
      s = dma->EnqueueToDevice(p.device, p.dst, from, p.bytes);
    }
    std::vector<uint64_t> all(regions.size());
    if (s.ok()) engine_.RunPieces(regions, all);
    if (dma) {
      // Wait even after an enqueue error: the slot is released next.
      absl::Status w = dma->Wait();
      if (s.ok() && !w.ok()) s = Annotate(w, "restore: device copies");
    }
    CKPT_RETURN_IF_ERROR(s);
    std::copy(all.begin(), all.begin() + static_cast<ptrdiff_t>(chunks.size()),
              hashes.begin());
  } else {
    // From the file: the touched chunks through the FileRestorer's reads
    // (io_uring, O_DIRECT, reads in flight, each chunk hashed as it lands,
    // straight into its run's memory when aligned); the parts are copied
    // out of each chunk while it is in memory.
    std::vector<client::FileRestorer::Span> spans;
    spans.reserve(chunks.size());
    for (const Chunk& c : chunks) spans.push_back({c.at, c.bytes, c.dst});
    const client::FileRestorer::Landed landed =
        [&](size_t k, const char* at,
            client::DeviceCopyBatch* dma) -> absl::Status {
      for (size_t j = part_first[k]; j < part_first[k + 1]; ++j) {
        const Part& p = parts[j];
        if (p.device < 0) {
          std::memcpy(p.dst, at + p.at, p.bytes);
          continue;
        }
        CKPT_RETURN_IF_ERROR(
            dma->EnqueueToDevice(p.device, p.dst, at + p.at, p.bytes));
      }
      return absl::OkStatus();
    };
    CKPT_RETURN_IF_ERROR(file_restorer_->ReadSpans(src.path, resp.image_bytes(),
                                                   spans, hashes, landed));
  }

  // Each saved piece: its chunks against their own hashes, or its whole
  // checksum.
  for (const SavedPiece& u : used) {
    const v1::TensorMeta& m = *u.meta;
    if (!m.has_checksum()) continue;
    const std::span<const uint64_t> got =
        std::span<const uint64_t>(hashes).subspan(u.first, u.chunks.size());
    if (u.by_chunk) {
      for (size_t k = 0; k < got.size(); ++k) {
        const uint64_t want = m.chunk_hashes(static_cast<int>(u.chunks[k]));
        if (got[k] != want)
          return absl::DataLossError(absl::StrFormat(
              "tensor %s of saved rank %d: checksum mismatch in chunk %d "
              "(stored %016x, computed %016x)",
              QuotePrefix(m.name()), saved_rank, u.chunks[k], want, got[k]));
      }
      continue;
    }
    const uint64_t sum = CombineChunkHashes(got);
    if (sum != m.checksum())
      return absl::DataLossError(absl::StrFormat(
          "tensor %s of saved rank %d: checksum mismatch (stored %016x, "
          "computed %016x)",
          QuotePrefix(m.name()), saved_rank, m.checksum(), sum));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
