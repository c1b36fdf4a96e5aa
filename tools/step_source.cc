#include "tools/step_source.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt.pb.h"
#include "storage/keys.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/reshard_plan.h"
#include "tools/shard_access.h"
#include "tools/text_output.h"
#include "util/checksum.h"
#include "util/program.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

// ckpt.torch's own tensors in each of its shards (tools/export_plan.h).
constexpr char kTorchHeader[] = "%ckpt/header";
constexpr char kTorchSkeleton[] = "%ckpt/skeleton";

// A shard's tensor index as the TensorMeta list the daemon builds the
// step's layout index from (its catalog holds the same fields).
std::vector<v1::TensorMeta> MetasOf(const storage::ShardInfo& info) {
  std::vector<v1::TensorMeta> out;
  out.reserve(info.tensors.size());
  for (const storage::ShardTensor& t : info.tensors) {
    v1::TensorMeta& m = out.emplace_back();
    m.set_name(t.name);
    m.set_dtype(static_cast<uint32_t>(t.dtype));
    for (uint64_t d : t.shape) m.add_shape(d);
    m.set_offset(t.offset);
    m.set_bytes(t.bytes);
    m.set_checksum(t.checksum);
    m.set_has_checksum(true);
    for (uint64_t d : t.global_shape) m.add_global_shape(d);
    for (uint64_t d : t.piece_offsets) m.add_piece_offsets(d);
    if (!t.global_name.empty()) m.set_global_name(t.global_name);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepSource>> StepSource::Open(
    const std::string& root, const std::string& job, uint64_t step) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job, "--job"));
  // A descriptor per rank's shard (and reshard's per new rank): the soft
  // limit on open files goes up to the hard one; past that, opening a
  // shard fails naming it.
  (void)RaiseDescriptorLimit();
  std::unique_ptr<StepSource> s(new StepSource());
  s->job_ = job;
  s->step_ = step;
  CKPT_ASSIGN_OR_RETURN(s->backend_, OpenRoot(root, "--root"));
  CKPT_RETURN_IF_ERROR(s->ReadManifest(root));
  CKPT_RETURN_IF_ERROR(s->OpenShards());
  CKPT_RETURN_IF_ERROR(s->BuildIndex());
  return s;
}

absl::Status StepSource::ReadManifest(const std::string& root) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> job_keys,
                        backend_->List(storage::JobPrefix(job_)));
  if (job_keys.empty())
    return absl::NotFoundError(absl::StrCat(
        "--job ", job_, ": no checkpoint of that job under ", root));
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        backend_->List(storage::StepPrefix(job_, step_)));
  if (keys.empty())
    return absl::NotFoundError(absl::StrCat("--step ", step_, ": job ", job_,
                                            " has no step ", step_, " under ",
                                            root));
  const std::string node_key = storage::ManifestKey(job_, step_);
  const std::string global_key = storage::GlobalManifestKey(job_, step_);
  const bool has_node = std::count(keys.begin(), keys.end(), node_key) > 0;
  const bool has_global = std::count(keys.begin(), keys.end(), global_key) > 0;
  if (has_node) {
    manifest_key_ = node_key;
    CKPT_ASSIGN_OR_RETURN(std::string text,
                          storage::ReadManifestText(*backend_, node_key));
    CKPT_ASSIGN_OR_RETURN(storage::v1::NodeManifest m,
                          storage::DecodeNodeManifest(text, node_key));
    world_size_ = m.world_size();
    listed_.resize(world_size_);
    for (const storage::v1::NodeManifestShard& sh : m.shards()) {
      Listed& l = listed_[sh.rank()];  // one per rank: decode checked it
      l.key = sh.key();
      l.bytes = sh.bytes();
      l.has_tensors = sh.has_tensors();
      l.tensors = sh.tensors();
      if (sh.has_checksums_digest()) l.digest = sh.checksums_digest();
    }
    if (m.has_layout_index()) manifest_index_ = m.layout_index();
    return absl::OkStatus();
  }
  if (has_global) {
    manifest_key_ = global_key;
    CKPT_ASSIGN_OR_RETURN(storage::v1::GlobalManifest m,
                          storage::ReadGlobalManifest(*backend_, job_, step_));
    world_size_ = m.world_size();
    listed_.resize(world_size_);
    for (const storage::v1::ManifestShard& sh : m.shards()) {
      if (!storage::IsShardKeyOf(sh.key(), job_, step_, sh.rank()))
        return absl::DataLossError(absl::StrCat(
            global_key, ": rank ", sh.rank(), ": key \"",
            sh.key().substr(0, 200), "\" is not this step's shard of it"));
      Listed& l = listed_[sh.rank()];
      l.key = sh.key();
      l.bytes = sh.bytes();
      l.digest = sh.checksum_digest();
    }
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--step ", step_, ": job ", job_, " step ", step_,
      " is not complete under ", root, ": no ", node_key, " (one node) or ",
      global_key, " (cluster); ckptctl verify shows what is there"));
}

absl::Status StepSource::OpenShards() {
  uint64_t total = 0;
  for (const Listed& l : listed_) total += l.bytes;
  Progress progress("verify", total);
  readers_.resize(world_size_);
  for (uint32_t r = 0; r < world_size_; ++r) {
    const Listed& l = listed_[r];
    const std::string where = absl::StrCat("rank ", r, ": shard ", l.key);
    {
      // A reader of its own for the verification: its stream buffer goes
      // with it, so the readers kept hold no more than their metadata.
      absl::StatusOr<std::unique_ptr<storage::ShardReader>> v =
          storage::ShardReader::Open(*backend_, l.key);
      if (!v.ok()) return Annotate(v.status(), where);
      const storage::ShardInfo& info = (*v)->info();
      if (info.job != job_ || info.step != step_ || info.rank != r)
        return absl::DataLossError(absl::StrFormat(
            "%s: its header names job \"%s\" step %d rank %d", where,
            info.job.substr(0, 128), info.step, info.rank));
      if (info.world_size != world_size_)
        return absl::DataLossError(
            absl::StrFormat("%s: world size %d, %s says %d", where,
                            info.world_size, manifest_key_, world_size_));
      if ((*v)->object().size() != l.bytes)
        return absl::DataLossError(absl::StrFormat("%s: %d bytes, %s says %d",
                                                   where, (*v)->object().size(),
                                                   manifest_key_, l.bytes));
      if (l.has_tensors && l.tensors != info.tensors.size())
        return absl::DataLossError(absl::StrFormat("%s: %d tensors, %s says %d",
                                                   where, info.tensors.size(),
                                                   manifest_key_, l.tensors));
      if (!l.digest.empty() &&
          l.digest != storage::DigestHex(storage::ChecksumsDigest(info)))
        return absl::DataLossError(
            absl::StrCat(where, ": its tensor checksums do not match ",
                         manifest_key_, "'s digest"));
      CKPT_RETURN_IF_ERROR(
          (*v)->Verify([&](const storage::ShardTensor& t, uint64_t) {
            progress.Add(t.bytes);
          }));
    }
    absl::StatusOr<std::unique_ptr<storage::ShardReader>> reader =
        storage::ShardReader::Open(*backend_, l.key);
    if (!reader.ok()) return Annotate(reader.status(), where);
    shard_bytes_ += l.bytes;
    readers_[r] = std::move(*reader);
  }
  progress.Finish();
  return absl::OkStatus();
}

absl::Status StepSource::BuildIndex() {
  std::vector<std::vector<v1::TensorMeta>> metas(world_size_);
  for (uint32_t r = 0; r < world_size_; ++r)
    metas[r] = MetasOf(readers_[r]->info());
  // The daemon's index has every tensor (it could build it: the ranks'
  // skeletons had one size); it must be the one the shards make.
  if (!manifest_index_.empty()) {
    absl::StatusOr<storage::LayoutIndex> all =
        storage::BuildLayoutIndex(world_size_, metas);
    if (!all.ok() || storage::SerializeLayoutIndex(*all) != manifest_index_)
      return absl::DataLossError(absl::StrCat(
          manifest_key_,
          ": layout_index does not match the layouts its shards record"));
  }
  // ckpt.torch's per-rank structure is left out.
  torch_ = world_size_ > 0;
  for (std::vector<v1::TensorMeta>& m : metas) {
    const size_t before = m.size();
    std::erase_if(m, [](const v1::TensorMeta& t) {
      return t.name() == kTorchHeader || t.name() == kTorchSkeleton;
    });
    torch_ = torch_ && before == m.size() + 2;
  }
  absl::StatusOr<storage::LayoutIndex> index =
      storage::BuildLayoutIndex(world_size_, metas);
  if (!index.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_, " step ", step_,
                     ": its tensors do not form global tensors: ",
                     index.status().message()));
  index_ = std::move(*index);
  // Each saved piece is one tensor of its rank's shard, at its offset.
  piece_tensor_.resize(index_.num_pieces());
  for (uint64_t p = 0; p < index_.num_pieces(); ++p) {
    const auto& tensors = readers_[index_.piece_rank(p)]->info().tensors;
    auto it = std::lower_bound(tensors.begin(), tensors.end(),
                               index_.piece_data_offset(p),
                               [](const storage::ShardTensor& t, uint64_t off) {
                                 return t.offset < off;
                               });
    // An empty tensor has the offset of the next one, and is no piece.
    while (it != tensors.end() && it->bytes == 0 &&
           it->offset == index_.piece_data_offset(p))
      ++it;
    if (it == tensors.end() || it->offset != index_.piece_data_offset(p))
      return absl::InternalError(absl::StrCat(
          "piece ", p, " of rank ", index_.piece_rank(p), " is in no tensor"));
    piece_tensor_[p] = static_cast<uint32_t>(it - tensors.begin());
  }
  // Replicas of a box (adjacent in the index) are read once: they must be
  // the same bytes.
  for (const storage::LayoutTensor& t : index_.tensors()) {
    for (uint64_t p = t.first_piece + 1; p < t.first_piece + t.num_pieces;
         ++p) {
      if (!(index_.PieceBox(p) == index_.PieceBox(p - 1))) continue;
      const uint64_t a = PieceTensor(p - 1).checksum,
                     b = PieceTensor(p).checksum;
      if (a != b)
        return absl::FailedPreconditionError(absl::StrFormat(
            "tensor \"%s\": ranks %d and %d both hold %s with other bytes "
            "(checksums %s and %s): they are not replicas of one global "
            "tensor, and only one value per element can be written",
            t.name.substr(0, 160), index_.piece_rank(p - 1),
            index_.piece_rank(p), index_.PieceBox(p).ToString(), HexChecksum(a),
            HexChecksum(b)));
    }
  }
  return absl::OkStatus();
}

const storage::ShardTensor& StepSource::PieceTensor(uint64_t piece) const {
  return readers_[index_.piece_rank(piece)]
      ->info()
      .tensors[piece_tensor_[piece]];
}

absl::Status StepSource::AssembleRequested(
    const storage::LayoutIndex& requested, Sink sink) {
  struct Run {
    uint64_t request, dst, piece, src, len;
  };
  std::vector<Run> runs;
  // A window's part of one run.
  struct Segment {
    uint64_t piece, src, dst, len;  // dst: in the window
  };
  std::vector<Segment> segments;
  std::unique_ptr<char[]> window, scratch;
  for (size_t t = 0; t < requested.tensors().size(); ++t) {
    const storage::LayoutTensor& rt = requested.tensors()[t];
    const int64_t st = index_.FindTensor(rt.name);
    if (st < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", rt.name.substr(0, 160), "\" is not in the step"));
    const storage::LayoutTensor& saved = index_.tensors()[st];
    if (saved.dtype != rt.dtype || saved.ndim != rt.ndim ||
        !std::equal(rt.global_shape.begin(), rt.global_shape.begin() + rt.ndim,
                    saved.global_shape.begin()))
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", rt.name.substr(0, 160),
                       "\": asked with another dtype or global shape"));
    if (rt.num_pieces == 0) continue;
    runs.clear();
    CKPT_RETURN_IF_ERROR(storage::PlanReshardTensors(
        index_, requested, {}, t, t + 1, [&](const storage::PlannedRead& read) {
          storage::ForEachByteRun(
              index_, requested, read,
              [&](uint64_t src, uint64_t dst, uint64_t len) {
                runs.push_back({read.request, dst, read.saved_piece, src, len});
              });
        }));
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
      return a.request != b.request ? a.request < b.request : a.dst < b.dst;
    });
    if (!window) window.reset(new char[kWindowBytes]);
    const uint64_t elem = DTypeSize(rt.dtype);
    size_t i = 0;
    for (uint64_t q = rt.first_piece; q < rt.first_piece + rt.num_pieces; ++q) {
      const uint64_t bytes = requested.PieceBox(q).Elements() * elem;
      while (i < runs.size() && runs[i].request < q) ++i;
      for (uint64_t w = 0; w < bytes; w += kWindowBytes) {
        const uint64_t n = std::min(kWindowBytes, bytes - w);
        // The window's segments, then read by saved piece: segments
        // contiguous in their piece (the rows of a column-sharded piece)
        // are one read into `scratch`, copied to their places.
        segments.clear();
        uint64_t covered = 0;
        for (size_t j = i;
             j < runs.size() && runs[j].request == q && runs[j].dst < w + n;
             ++j) {
          const Run& run = runs[j];
          const uint64_t lo = std::max(run.dst, w),
                         hi = std::min(run.dst + run.len, w + n);
          if (lo >= hi) continue;
          const uint64_t src = run.src + (lo - run.dst);
          if (src + (hi - lo) > PieceTensor(run.piece).bytes)
            return absl::InternalError(
                absl::StrCat("tensor \"", rt.name.substr(0, 160),
                             "\": a read past its piece"));
          segments.push_back({run.piece, src, lo - w, hi - lo});
          covered += hi - lo;
        }
        std::sort(segments.begin(), segments.end(),
                  [](const Segment& a, const Segment& b) {
                    return a.piece != b.piece ? a.piece < b.piece
                                              : a.src < b.src;
                  });
        for (size_t a = 0; a < segments.size();) {
          size_t b = a + 1;
          uint64_t end = segments[a].src + segments[a].len;
          while (b < segments.size() &&
                 segments[b].piece == segments[a].piece &&
                 segments[b].src == end) {
            end += segments[b].len;
            ++b;
          }
          const storage::ShardTensor& from = PieceTensor(segments[a].piece);
          storage::ShardReader& reader =
              *readers_[index_.piece_rank(segments[a].piece)];
          const uint64_t span = end - segments[a].src;  // <= n
          if (b > a + 1 && !scratch) scratch.reset(new char[kWindowBytes]);
          char* into =
              b == a + 1 ? window.get() + segments[a].dst : scratch.get();
          absl::Status s =
              reader.object().ReadAt(from.offset + segments[a].src, into, span);
          if (!s.ok())
            return Annotate(s, absl::StrCat(reader.key(), ": tensor \"",
                                            from.name.substr(0, 160), "\""));
          if (b > a + 1)
            for (size_t k = a; k < b; ++k)
              std::memcpy(window.get() + segments[k].dst,
                          scratch.get() + (segments[k].src - segments[a].src),
                          segments[k].len);
          a = b;
        }
        if (covered != n)
          return absl::InternalError(absl::StrFormat(
              "tensor \"%s\": bytes [%d, %d) of requested piece %d: %d "
              "filled",
              rt.name.substr(0, 160), w, w + n, q, covered));
        CKPT_RETURN_IF_ERROR(sink(q, w, window.get(), n));
        while (i < runs.size() && runs[i].request == q &&
               runs[i].dst + runs[i].len <= w + n)
          ++i;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
