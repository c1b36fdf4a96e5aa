// The persister: staged slots to storage, manifests, retention (the
// decisions are retention.h's). See engine.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "util/status.h"

namespace ckpt::daemon {

std::optional<PersistSnapshot> Engine::SnapshotPersist(
    const PersistTask& task) {
  Section lock(this);
  Shard* shard = table_.FindShard(task.job, task.step, task.rank);
  if (shard == nullptr || shard->gen != task.gen ||
      shard->phase != ShardPhase::kStaged || shard->slot < 0)
    return std::nullopt;
  PersistSnapshot snap;
  snap.key = NodeShardKey(task.job, task.step, task.rank);
  if (table_.leases().HoldsFile(snap.key, false)) {
    // A FILE restore reads the older save's file at this key: the
    // rename would swap the inode under it. The bytes wait in memory.
    PersistTask later = task;
    later.not_before = options_.clock->Now() + std::chrono::milliseconds(50);
    persister_->Push(std::move(later));
    return std::nullopt;
  }
  Job& job = *table_.Find(task.job);
  Rank& rank = job.ranks[task.rank];
  table_.MoveShard(job, *shard, ShardPhase::kPersisting);
  snap.image = rank.arena->slot_data(shard->slot);
  snap.arena = rank.arena;
  snap.owner_uid = job.rec.uid();
  snap.info = shard->info;  // validated at commit
  snap.known = KnownChecksums(shard->rec.tensors());
  return snap;
}

void Engine::RecordPersist(const PersistTask& task, PersistOutcome outcome) {
  const std::string key = NodeShardKey(task.job, task.step, task.rank);
  const absl::Status s = outcome.status;
  const double seconds = outcome.seconds;
  Section lock(this);
  JobTable::PersistResult r =
      table_.Persisted(task, key, std::move(outcome), options_.clock->Now());
  Apply(r.effects);
  switch (r.verdict.kind) {
    case PersistVerdict::kOrphan:
      break;
    case PersistVerdict::kDurable:
      ++persisted_shards_;
      persisted_bytes_ += r.bytes;
      metrics_->Persisted(metric::kTierLocal, seconds, r.bytes);
      break;
    case PersistVerdict::kAbandon:
    case PersistVerdict::kRetry:
      ++failed_persists_;
      LogWarning(absl::StrCat("persist ", key, " (attempt ", r.attempts,
                              "): ", s.message()));
      if (r.verdict.kind == PersistVerdict::kAbandon) {
        metrics_->Failure(metric::kPersistChecksum);
        metrics_->Failure(metric::kPersistAbandoned);
      } else {
        metrics_->Failure(metric::kPersistWrite);
        metrics_->Retry(metric::kRetryPersist);
      }
      break;
  }
  if (Job* job = table_.Find(task.job); job != nullptr && r.effects.retention)
    ApplyRetention(*job);
  if (r.effects.forget_job) MaybeForgetJob(task.job);
  lock.Unlock();
  Perform(std::move(r.effects));
}

void Engine::MaybeQueueManifest(Job& job, uint64_t step_no) {
  if (!table_.ManifestDue(job, step_no)) return;
  persister_->Push(
      PersistTask{PersistTask::kManifest, job.rec.job(), step_no, 0, 0, {}});
}

std::optional<ManifestSnapshot> Engine::SnapshotManifest(const std::string& job,
                                                         uint64_t step_no,
                                                         bool object,
                                                         bool* written) {
  Section lock(this);
  *written = false;
  Job* j = table_.Find(job);
  if (j == nullptr) return std::nullopt;
  auto step = j->steps.find(step_no);
  if (step == j->steps.end()) return std::nullopt;
  *written = object ? step->second.object_manifest : step->second.manifest;
  if (*written) return std::nullopt;
  if (object)
    for (const auto& [r, shard] : step->second.shards)
      if (!shard.uploaded) return std::nullopt;
  bool durable = false;
  if (!table_.StepComplete(*j, step->second, &durable) || !durable)
    return std::nullopt;
  return ManifestSnapshot{
      NodeManifestOf(job, step_no, j->rec.world_size(), step->second),
      ShardGenerations(step->second)};
}

bool Engine::RecordManifest(const std::string& job, uint64_t step_no,
                            bool object, const ManifestSnapshot& m,
                            const absl::Status& s) {
  Section lock(this);
  if (!s.ok()) {
    LogWarning(absl::StrCat("manifest of ", job, " step ", step_no, ": ",
                            s.message()));
    metrics_->Failure(metric::kManifestWrite);
    metrics_->Retry(metric::kRetryManifest);
    PersistTask retry{PersistTask::kManifest, job, step_no, 0, 0, {}};
    retry.not_before = options_.clock->Now() + options_.persist_retry_delay;
    persister_->Push(std::move(retry));
    return false;
  }
  Job* j = table_.Find(job);
  if (j == nullptr) return false;
  auto step = j->steps.find(step_no);
  if (step == j->steps.end() || ShardGenerations(step->second) != m.gens)
    return false;
  if (object) {
    step->second.object_manifest = true;
  } else {
    step->second.manifest = true;
    metrics_->StepDurable(job, step_no);
  }
  ApplyRetention(*j);
  return true;
}

void Engine::ApplyRetention(Job& job) {
  const Hosting* hosting = table_.HostingOf(job.rec.job());
  if (object_ != nullptr) {
    ApplyTieredRetention(job, hosting);
    return;
  }
  for (auto [n, r] : ShardsToDrop(job.steps, options_.retain_steps,
                                  !options_.node_id.empty(), hosting))
    DropShard(job, n, r, /*delete_file=*/true);
}

bool Engine::WaitIdle(std::chrono::milliseconds timeout) {
  return persister_->WaitIdle(timeout);
}

size_t Engine::Drain(std::chrono::milliseconds deadline) {
  Section lock(this);
  draining_ = true;
  table_.Wake(JobTable::Waiter::kSlot);  // waiting saves give up
  auto pending = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) {
    return table_.NotDurable();
  };
  const auto until = std::chrono::steady_clock::now() + deadline;
  auto remaining = [&] {
    return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                        until - std::chrono::steady_clock::now()),
                    std::chrono::milliseconds(0));
  };
  while (pending() != 0 &&
         table_.WaitUntil(JobTable::Waiter::kDurable, until)) {
  }
  if (pending() == 0) {
    // The manifests and deletes the last persists queued (the persist
    // queue has its own lock and waiters).
    lock.Unlock();
    (void)persister_->WaitIdle(remaining());
    lock.Relock();
  }
  size_t left = pending();
  if (left == 0 && ObjectCommit()) {
    // The commit tier is the object store: wait for the uploads too.
    lock.Unlock();
    if (!uploader_->WaitIdle(remaining())) {
      lock.Relock();
      table_.ForEachVisible(/*uid=*/0, /*only=*/"", [&](const Job& job) {
        for (const auto& [s, step] : job.steps)
          for (const auto& [r, shard] : step.shards)
            if (shard.phase == ShardPhase::kDurable && !shard.uploaded) ++left;
      });
    }
  }
  return left;
}

}  // namespace ckpt::daemon
