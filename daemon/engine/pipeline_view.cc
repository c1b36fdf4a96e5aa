// The pipeline's view of the job table: a persist's, a manifest's and an
// upload's snapshot and record (the stages' I/O is pipeline.h's), and
// Drain. See pipeline_view.h.
#include "daemon/engine/pipeline_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "storage/manifest.h"
#include "util/status.h"

namespace ckpt::daemon {

std::optional<PersistSnapshot> PipelineView::SnapshotPersist(
    const PersistTask& task) {
  Section lock(&node_);
  Shard* shard = node_.table.FindShard(task.job, task.step, task.rank);
  if (shard == nullptr || shard->gen != task.gen ||
      shard->phase != ShardPhase::kStaged || shard->slot < 0)
    return std::nullopt;
  PersistSnapshot snap;
  snap.key = node_.NodeShardKey(task.job, task.step, task.rank);
  if (node_.table.leases().HoldsFile(snap.key, false)) {
    // A FILE restore reads the older save's file at this key: the
    // rename would swap the inode under it. The bytes wait in memory.
    PersistTask later = task;
    later.not_before =
        node_.options.clock->Now() + std::chrono::milliseconds(50);
    node_.persister->Push(std::move(later));
    return std::nullopt;
  }
  Job& job = *node_.table.Find(task.job);
  Rank& rank = job.ranks[task.rank];
  node_.table.MoveShard(job, *shard, ShardPhase::kPersisting);
  snap.image = rank.arena->slot_data(shard->slot);
  snap.arena = rank.arena;
  snap.owner_uid = job.rec.uid();
  snap.info = shard->info;  // validated at commit
  snap.known = KnownChecksums(shard->rec.tensors());
  return snap;
}

void PipelineView::RecordPersist(const PersistTask& task,
                                 PersistOutcome outcome) {
  const std::string key = node_.NodeShardKey(task.job, task.step, task.rank);
  const absl::Status s = outcome.status;
  const double seconds = outcome.seconds;
  Section lock(&node_);
  JobTable::PersistResult r = node_.table.Persisted(
      task, key, std::move(outcome), node_.options.clock->Now());
  node_.Apply(r.effects);
  switch (r.verdict.kind) {
    case PersistVerdict::kOrphan:
      break;
    case PersistVerdict::kDurable:
      ++node_.persisted_shards;
      node_.persisted_bytes += r.bytes;
      node_.metrics->Persisted(metric::kTierLocal, seconds, r.bytes);
      break;
    case PersistVerdict::kAbandon:
    case PersistVerdict::kRetry:
      ++node_.failed_persists;
      LogWarning(absl::StrCat("persist ", key, " (attempt ", r.attempts,
                              "): ", s.message()));
      if (r.verdict.kind == PersistVerdict::kAbandon) {
        node_.metrics->Failure(metric::kPersistChecksum);
        node_.metrics->Failure(metric::kPersistAbandoned);
      } else {
        node_.metrics->Failure(metric::kPersistWrite);
        node_.metrics->Retry(metric::kRetryPersist);
      }
      break;
  }
  if (Job* job = node_.table.Find(task.job);
      job != nullptr && r.effects.retention)
    node_.ApplyRetention(*job);
  if (r.effects.forget_job) node_.MaybeForgetJob(task.job);
  lock.Unlock();
  node_.Perform(std::move(r.effects));
}

std::optional<ManifestSnapshot> PipelineView::SnapshotManifest(
    const std::string& job, uint64_t step_no, bool object, bool* written) {
  Section lock(&node_);
  *written = false;
  Job* j = node_.table.Find(job);
  if (j == nullptr) return std::nullopt;
  auto step = j->steps.find(step_no);
  if (step == j->steps.end()) return std::nullopt;
  *written = object ? step->second.object_manifest : step->second.manifest;
  if (*written) return std::nullopt;
  if (object)
    for (const auto& [r, shard] : step->second.shards)
      if (!shard.uploaded) return std::nullopt;
  bool durable = false;
  if (!node_.table.StepComplete(*j, step->second, &durable) || !durable)
    return std::nullopt;
  ManifestSnapshot snap{
      NodeManifestOf(job, step_no, j->rec.world_size(), step->second),
      ShardGenerations(step->second),
      {}};
  bool layouts = false;
  for (const auto& [r, shard] : step->second.shards)
    for (const v1::TensorMeta& t : shard.rec.tensors())
      layouts |= t.global_shape_size() != 0;
  if (layouts) {
    snap.metas.resize(j->rec.world_size());
    for (const auto& [r, shard] : step->second.shards)
      if (r < snap.metas.size())
        snap.metas[r].assign(shard.rec.tensors().begin(),
                             shard.rec.tensors().end());
  }
  return snap;
}

bool PipelineView::RecordManifest(const std::string& job, uint64_t step_no,
                                  bool object, const ManifestSnapshot& m,
                                  const absl::Status& s) {
  Section lock(&node_);
  if (!s.ok()) {
    LogWarning(absl::StrCat("manifest of ", job, " step ", step_no, ": ",
                            s.message()));
    node_.metrics->Failure(metric::kManifestWrite);
    node_.metrics->Retry(metric::kRetryManifest);
    PersistTask retry{PersistTask::kManifest, job, step_no, 0, 0, {}};
    retry.not_before =
        node_.options.clock->Now() + node_.options.persist_retry_delay;
    node_.persister->Push(std::move(retry));
    return false;
  }
  Job* j = node_.table.Find(job);
  if (j == nullptr) return false;
  auto step = j->steps.find(step_no);
  if (step == j->steps.end() || ShardGenerations(step->second) != m.gens)
    return false;
  if (object) {
    step->second.object_manifest = true;
  } else {
    step->second.manifest = true;
    node_.metrics->StepDurable(job, step_no);
  }
  node_.ApplyRetention(*j);
  return true;
}

absl::StatusOr<UploadSnapshot> PipelineView::SnapshotUpload(
    const UploadTask& task) {
  Section lock(&node_);
  Shard* shard = node_.table.FindShard(task.job, task.step, task.rank);
  if (shard == nullptr || shard->gen != task.gen ||
      shard->phase != ShardPhase::kDurable || shard->uploaded)
    return absl::CancelledError("no longer wanted");
  UploadSnapshot snap;
  snap.key = shard->rec.path();
  snap.bytes = shard->rec.image_bytes();
  snap.info = shard->info;
  if (shard->slot >= 0) {
    const Rank& rank = node_.table.Find(task.job)->ranks[task.rank];
    snap.arena = rank.arena;
    snap.slot = shard->slot;
    snap.write_no = rank.slots[shard->slot].write_no;
  }
  return snap;
}

bool PipelineView::SlotUnchanged(const UploadTask& task,
                                 const UploadSnapshot& snap) {
  Section lock(&node_);
  Job* job = node_.table.Find(task.job);
  if (job == nullptr) return false;
  auto rank = job->ranks.find(task.rank);
  return rank != job->ranks.end() && rank->second.arena == snap.arena &&
         rank->second.slots[snap.slot].write_no == snap.write_no;
}

void PipelineView::RecordUpload(const UploadTask& task, const std::string& key,
                                uint64_t bytes, double seconds) {
  node_.metrics->Persisted(metric::kTierObject, seconds, bytes);
  Section lock(&node_);
  Effects fx = node_.table.Uploaded(task, key);
  node_.Apply(fx);
  lock.Unlock();
  node_.Perform(std::move(fx));
}

size_t PipelineView::Drain(std::chrono::milliseconds deadline) {
  Section lock(&node_);
  node_.draining = true;
  node_.table.Wake(JobTable::Waiter::kSlot);  // waiting saves give up
  auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu()) {
    return node_.table.NotDurable();
  };
  const auto until = std::chrono::steady_clock::now() + deadline;
  auto remaining = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                        until - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(0));
  };
  while (pending() != 0 &&
         node_.table.WaitUntil(JobTable::Waiter::kDurable, until)) {
  }
  if (pending() == 0) {
    // The manifests and deletes the last persists queued (the persist
    // queue has its own lock and waiters).
    lock.Unlock();
    (void)node_.persister->WaitIdle(remaining());
    lock.Relock();
  }
  size_t left = pending();
  if (left == 0 && node_.ObjectCommit()) {
    // The commit tier is the object store: wait for the uploads too.
    lock.Unlock();
    if (!node_.uploader->WaitIdle(remaining())) {
      lock.Relock();
      node_.table.ForEachVisible(/*uid=*/0, /*only=*/"", [&](const Job& job) {
        for (const auto& [s, step] : job.steps)
          for (const auto& [r, shard] : step.shards)
            if (shard.phase == ShardPhase::kDurable && !shard.uploaded) ++left;
      });
    }
  }
  return left;
}

}  // namespace ckpt::daemon
