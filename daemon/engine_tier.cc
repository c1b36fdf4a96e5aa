// The object tier's state: what an upload sends and what it recorded
// (the pipeline's stages, pipeline.h, do the I/O), the object manifest's
// queueing, tiered retention and reads back. See engine.h; the tiers are
// described in doc/object-tier.md.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_image.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// Reads the object of `bytes` bytes into dst and checks every tensor's
// checksum, each as soon as its last byte is in, on the thread that
// brought that byte, while the other requests are still on the wire: a
// pass over the image after the reads would add its whole time to the
// restore. The error of a mismatch is VerifyTensorChecksums' (the lowest
// mismatching tensor's when several mismatch).
absl::Status ReadVerified(storage::ObjectReader& reader,
                          const storage::ShardInfo& info,
                          const std::string& key, char* dst, uint64_t bytes) {
  const size_t n = info.tensors.size();
  std::vector<std::atomic<uint64_t>> left(n);
  for (size_t i = 0; i < n; ++i) left[i].store(info.tensors[i].bytes);
  std::mutex mu;
  size_t bad_index = n;
  absl::Status bad;
  auto verify = [&](size_t i) {
    absl::Status s = storage::VerifyTensorChecksum(dst, info, key, i);
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    if (i < bad_index) bad_index = i, bad = std::move(s);
  };
  auto arrived = [&](uint64_t off, uint64_t len) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t a = info.tensors[i].offset;
      const uint64_t b = a + info.tensors[i].bytes;
      const uint64_t lo = std::max(a, off), hi = std::min(b, off + len);
      if (lo >= hi) continue;
      if (left[i].fetch_sub(hi - lo) == hi - lo) verify(i);  // the last piece
    }
  };
  CKPT_RETURN_IF_ERROR(reader.ReadAtNotify(0, dst, bytes, arrived));
  // Tensors no piece completed (empty ones; any the image does not hold,
  // which the image's validation refuses) are checked here.
  for (size_t i = 0; i < n; ++i)
    if (left[i].load() != 0 || info.tensors[i].bytes == 0) verify(i);
  return bad;
}

}  // namespace

std::optional<UploadBacklog> Engine::ObjectBacklog() const {
  if (!uploader_) return std::nullopt;
  return uploader_->Backlog();
}

void Engine::QueueUpload(const Job& job, const Shard& shard) {
  if (std::optional<UploadTask> t = JobTable::UploadOf(job, shard))
    uploader_->Push(std::move(*t));
}

absl::StatusOr<UploadSnapshot> Engine::SnapshotUpload(const UploadTask& task) {
  Section lock(this);
  Shard* shard = table_.FindShard(task.job, task.step, task.rank);
  if (shard == nullptr || shard->gen != task.gen ||
      shard->phase != ShardPhase::kDurable || shard->uploaded)
    return absl::CancelledError("no longer wanted");
  UploadSnapshot snap;
  snap.key = shard->rec.path();
  snap.bytes = shard->rec.image_bytes();
  snap.info = shard->info;
  if (shard->slot >= 0) {
    const Rank& rank = table_.Find(task.job)->ranks[task.rank];
    snap.arena = rank.arena;
    snap.slot = shard->slot;
    snap.write_no = rank.slots[shard->slot].write_no;
  }
  return snap;
}

bool Engine::SlotUnchanged(const UploadTask& task, const UploadSnapshot& snap) {
  Section lock(this);
  Job* job = table_.Find(task.job);
  if (job == nullptr) return false;
  auto rank = job->ranks.find(task.rank);
  return rank != job->ranks.end() && rank->second.arena == snap.arena &&
         rank->second.slots[snap.slot].write_no == snap.write_no;
}

void Engine::RecordUpload(const UploadTask& task, const std::string& key,
                          uint64_t bytes, double seconds) {
  metrics_->Persisted(metric::kTierObject, seconds, bytes);
  Section lock(this);
  Effects fx = table_.Uploaded(task, key);
  Apply(fx);
  lock.Unlock();
  Perform(std::move(fx));
}

void Engine::MaybeQueueObjectManifest(Job& job, uint64_t step_no) {
  if (auto manifest = table_.ObjectManifestDue(job, step_no))
    uploader_->Push(std::move(*manifest));
}

void Engine::QueueObjectDelete(Job& job, uint64_t step_no) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return;
  UploadTask del{UploadTask::kDelete, job.rec.job(), step_no};
  // The manifest goes whether or not this daemon saw it written: an upload
  // that raced a delete must not leave a visible step.
  del.keys.push_back(NodeManifestKey(job.rec.job(), step_no));
  for (const auto& [r, shard] : step->second.shards)
    if (shard.uploaded) del.keys.push_back(shard.rec.path());
  shard_drops_->QueueObjectDelete(std::move(del));
  step->second.object_manifest = false;
  for (auto& [r, shard] : step->second.shards) shard.uploaded = false;
}

void Engine::DropLocalCopy(Job& job, uint64_t step_no) {
  for (auto& [r, shard] : job.steps[step_no].shards)
    if (!shard.local_gone && shard.phase == ShardPhase::kDurable)
      DropLocalShard(job, step_no, shard);
}

void Engine::DropLocalShard(Job& job, uint64_t step_no, Shard& shard) {
  Step& step = job.steps[step_no];
  if (step.manifest) {  // the step is not whole on local disk any more
    shard_drops_->QueueLocalDelete(
        job.rec.job(), step_no, NodeManifestKey(job.rec.job(), step_no), false);
    step.manifest = false;
  }
  shard_drops_->QueueLocalDelete(job.rec.job(), step_no, shard.rec.path(),
                                 false);
  shard.local_gone = true;
  shard.rec.set_local_gone(true);
  CatalogEdit edit;
  edit.PutShard(shard.rec);
  QueueEdit(std::move(edit), /*sync=*/false);
}

void Engine::ApplyTieredRetention(Job& job, const Hosting* hosting) {
  const bool cluster = !options_.node_id.empty();
  auto drop_step = [&](uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) {
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job.steps[n].shards) ranks.push_back(r);
    for (uint32_t r : ranks) DropShard(job, n, r, /*delete_file=*/true);
  };
  // The object tier first: whole steps go from both tiers, the object
  // manifest first (retention.h's ObjectTierStepsToDrop decides).
  for (uint64_t n :
       ObjectTierStepsToDrop(job.steps, options_.retain_object,
                             options_.retain_steps, cluster, hosting)) {
    QueueObjectDelete(job, n);
    drop_step(n);
  }
  // Then the local tier, over what is left (LocalTierDropsOf).
  const LocalTierDrops local = LocalTierDropsOf(
      job.steps, options_.retain_steps, job.rec.world_size(), cluster, hosting);
  for (uint64_t n : local.local_only) DropLocalCopy(job, n);
  for (uint64_t n : local.whole) drop_step(n);
}

absl::Status Engine::ReadShardImage(const std::string& key, bool local,
                                    bool object, const storage::ShardInfo& info,
                                    char* dst, uint64_t bytes,
                                    bool* from_object) {
  auto read = [&](storage::Backend& b) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          b.NewObjectReader(key));
    if (reader->size() != bytes)
      return absl::DataLossError(absl::StrCat(
          key, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
    return reader->ReadAt(0, dst, bytes);
  };
  *from_object = false;
  absl::Status s = absl::NotFoundError(key + ": no local copy");
  if (local) s = read(*backend_);
  if (s.ok() || !object) return s;
  if (local)
    LogWarning(absl::StrCat("load ", key, ": local copy unreadable (",
                            s.message(), "); reading the object tier"));
  *from_object = true;
  auto t0 = std::chrono::steady_clock::now();
  s = [&]() -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          object_->NewObjectReader(key));
    if (reader->size() != bytes)
      return absl::DataLossError(absl::StrCat(
          key, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
    return ReadVerified(*reader, info, key, dst, bytes);
  }();
  LogInfo(absl::StrFormat(
      "load %s from the object tier: GETs and checksums %.3f s", key,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count()));
  return Annotate(s, absl::StrCat("object tier (", object_->name(), ")"));
}

}  // namespace ckpt::daemon
