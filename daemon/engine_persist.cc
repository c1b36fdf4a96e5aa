// The persister: staged slots to storage, manifests, retention (the
// decisions are retention.h's). See engine.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "storage/shard_image.h"
#include "util/checksum.h"
#include "util/status.h"

namespace ckpt::daemon {

void Engine::PersistShard(const PersistTask& task) {
  char* image = nullptr;
  storage::ShardInfo info;
  std::vector<bool> has_checksum;
  uid_t owner_uid = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Shard* shard = FindShardLocked(task.job, task.step, task.rank);
    if (shard == nullptr || shard->gen != task.gen ||
        shard->phase != ShardPhase::kStaged || shard->slot < 0)
      return;
    if (leases_.HoldsFile(NodeShardKey(task.job, task.step, task.rank),
                          false)) {
      // A FILE restore reads the older save's file at this key: the
      // rename would swap the inode under it. The bytes wait in memory.
      PersistTask later = task;
      later.not_before =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
      persister_->Push(std::move(later));
      return;
    }
    Rank& rank = jobs_.find(task.job)->second.ranks[task.rank];
    shard->MoveTo(ShardPhase::kPersisting);
    rank.SetState(shard->slot, SlotStateOf(shard->phase));
    image = rank.arena->slot_data(shard->slot);
    owner_uid = jobs_.find(task.job)->second.rec.uid();
    info = shard->info;  // validated at commit
    has_checksum = KnownChecksums(shard->rec.tensors());
  }

  absl::Status s;
  bool computed = false;
  for (size_t i = 0; s.ok() && i < info.tensors.size(); ++i) {
    if (has_checksum[i]) continue;  // device tensors: the CPU never saw them
    info.tensors[i].checksum =
        TensorChecksum(image + info.tensors[i].offset, info.tensors[i].bytes);
    computed = true;
  }
  if (s.ok() && computed)
    s = storage::EncodeShardMetadata(
        info, std::span<char>(image, info.layout.image_bytes));
  const std::string key = NodeShardKey(task.job, task.step, task.rank);
  const auto write_start = std::chrono::steady_clock::now();
  if (s.ok()) {
    // The checksum pass runs on another core while the write is in flight.
    // A mismatch means the slot changed after the commit.
    auto verify = std::async(std::launch::async, [&] {
      return storage::VerifyTensorChecksums(
          image, info, absl::StrCat(key, " in shared memory"), has_checksum);
    });
    // The job's uid owns its shards, so its trainers can read them directly.
    storage::WriterOptions wo;
    wo.owner_uid = owner_uid;
    auto writer = backend_->NewObjectWriter(key, info.layout.image_bytes, wo);
    s = writer.status();
    // In pieces, so the watchdog sees a long write advance (the writer keeps
    // its queue full across calls).
    constexpr uint64_t kPiece = 256ull << 20;
    for (uint64_t off = 0; s.ok() && off < info.layout.image_bytes;
         off += kPiece) {
      s = (*writer)->WriteAt(off, image + off,
                             std::min(kPiece, info.layout.image_bytes - off));
      persister_->NoteProgress();
    }
    absl::Status v = verify.get();
    if (s.ok()) s = v;
    if (s.ok())
      s = (*writer)->Commit();
    else if (writer.ok())
      (*writer)->Abort();
  }

  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
  auto job = jobs_.find(task.job);
  Shard* shard = FindShardLocked(task.job, task.step, task.rank);
  if (shard != nullptr && shard->gen != task.gen) shard = nullptr;
  if (shard == nullptr) {
    // Deleted or replaced while we wrote: the file must not outlive it.
    bool current = false;
    if (job != jobs_.end()) {
      auto step = job->second.steps.find(task.step);
      current = step != job->second.steps.end() &&
                step->second.shards.count(task.rank);
      for (auto& [r, rank] : job->second.ranks)
        for (uint32_t i = 0; r == task.rank && i < rank.slots.size(); ++i)
          if (rank.slots[i].state == shm::SlotState::kPersisting &&
              rank.slots[i].gen == 0 && rank.arena->slot_data(i) == image) {
            rank.Free(i);
          }
    }
    if (s.ok() && !current)
      QueueLocalDeleteLocked(task.job, task.step, key, false);
    MaybeForgetJobLocked(task.job);
    return;
  }
  Rank& rank = job->second.ranks[task.rank];
  if (s.ok()) {
    shard->MoveTo(ShardPhase::kDurable);
    shard->rec.set_path(key);
    shard->rec.clear_error();
    shard->info = std::move(info);
    ToTensorMetas(shard->info, shard->rec.mutable_tensors());
    // Recorded in order, outside mu_: should the daemon stop before the
    // record is written, recovery adopts the file (engine_recover.cc).
    CatalogEdit edit;
    edit.PutShard(shard->rec);
    RecordLocked(std::move(edit), /*sync=*/true);
    rank.SetState(shard->slot, SlotStateOf(shard->phase));
    ++persisted_shards_;
    persisted_bytes_ += shard->info.layout.image_bytes;
    metrics_->Persisted(metric::kTierLocal,
                        std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - write_start)
                            .count(),
                        shard->info.layout.image_bytes);
    if (object_ != nullptr) QueueUploadLocked(job->second, *shard);
    if (!ObjectCommit()) ReportLocked(*shard, /*durable=*/true);
    MaybeQueueManifestLocked(job->second, task.step);
    return;
  }
  ++failed_persists_;
  ++shard->attempts;
  LogWarning(absl::StrCat("persist ", key, " (attempt ", shard->attempts,
                          "): ", s.message()));
  shard->rec.set_error(std::string(s.message()));
  bool corrupt = s.code() == absl::StatusCode::kDataLoss;
  metrics_->Failure(corrupt ? metric::kPersistChecksum : metric::kPersistWrite);
  if (corrupt) {
    metrics_->Failure(metric::kPersistAbandoned);
    rank.FailPersist(shard->slot);
    FailShardLocked(*shard, std::string(s.message()));
    // The step can never be whole now: retention may drop it.
    ApplyRetentionLocked(job->second);
    return;
  }
  // The bytes are still in the slot: retry for as long as they are.
  metrics_->Retry(metric::kRetryPersist);
  shard->MoveTo(ShardPhase::kStaged);
  if (shard->attempts >= options_.max_persist_attempts)
    rank.FailPersist(shard->slot);  // a newer save may take the slot now
  else
    rank.SetState(shard->slot, SlotStateOf(shard->phase));
  PersistTask retry = task;
  retry.not_before = std::chrono::steady_clock::now() +
                     std::min(options_.persist_retry_delay *
                                  (1u << std::min(shard->attempts - 1, 16u)),
                              std::max(options_.persist_retry_max_delay,
                                       options_.persist_retry_delay));
  persister_->Push(std::move(retry));
}

bool Engine::StepCompleteLocked(const Job& job, const Step& step,
                                bool* durable) const {
  auto hosted = hosted_.find(job.rec.job());
  return StepComplete(step, job.rec.world_size(),
                      hosted == hosted_.end() ? nullptr : &hosted->second,
                      durable);
}

void Engine::MaybeQueueManifestLocked(Job& job, uint64_t step_no) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end() || step->second.manifest) return;
  // A step whose local copy retention deleted gets no local manifest again.
  for (const auto& [r, shard] : step->second.shards)
    if (shard.local_gone) return;
  bool durable = false;
  if (!StepCompleteLocked(job, step->second, &durable) || !durable) return;
  persister_->Push(
      PersistTask{PersistTask::kManifest, job.rec.job(), step_no, 0, 0, {}});
  cv_.notify_all();
}

void Engine::WriteManifest(const PersistTask& task) {
  const std::string key = NodeManifestKey(task.job, task.step);
  // Built under the lock, written without it: a shard that changes
  // meanwhile (a re-save, a drop) saw no manifest to delete, so the one
  // written then is deleted here, and the step written again if whole.
  for (;;) {
    storage::v1::NodeManifest m;
    std::vector<std::pair<uint32_t, uint64_t>> gens;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto job = jobs_.find(task.job);
      if (job == jobs_.end()) return;
      auto step = job->second.steps.find(task.step);
      if (step == job->second.steps.end() || step->second.manifest) return;
      bool durable = false;
      if (!StepCompleteLocked(job->second, step->second, &durable) || !durable)
        return;
      m = NodeManifestOf(task.job, task.step, job->second.rec.world_size(),
                         step->second);
      gens = ShardGenerations(step->second);
    }
    absl::Status s = storage::WriteNodeManifest(*backend_, m, options_.node_id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok()) {
        LogWarning(absl::StrCat("manifest of ", task.job, " step ", task.step,
                                ": ", s.message()));
        metrics_->Failure(metric::kManifestWrite);
        metrics_->Retry(metric::kRetryManifest);
        PersistTask retry = task;
        retry.not_before =
            std::chrono::steady_clock::now() + options_.persist_retry_delay;
        persister_->Push(std::move(retry));
        return;
      }
      Job* job = nullptr;
      Step* step = nullptr;
      if (auto j = jobs_.find(task.job); j != jobs_.end()) {
        job = &j->second;
        if (auto st = job->steps.find(task.step); st != job->steps.end())
          step = &st->second;
      }
      if (step != nullptr && ShardGenerations(*step) == gens) {
        step->manifest = true;
        metrics_->StepDurable(task.job, task.step);
        ApplyRetentionLocked(*job);
        cv_.notify_all();
        return;
      }
    }
    absl::Status d = backend_->Delete(key);
    if (!d.ok()) {
      // Left for the next write of the step's manifest to replace.
      LogWarning(absl::StrCat("stale manifest ", key, ": ", d.message()));
      return;
    }
  }
}

void Engine::ApplyRetentionLocked(Job& job) {
  auto hosted = hosted_.find(job.rec.job());
  if (object_ != nullptr) {
    ApplyTieredRetentionLocked(
        job, hosted == hosted_.end() ? nullptr : &hosted->second);
    return;
  }
  const Hosting* hosting = hosted == hosted_.end() ? nullptr : &hosted->second;
  std::optional<uint64_t> cutoff = RetentionCutoff(
      job.steps, options_.retain_steps, !options_.node_id.empty(), hosting);
  std::vector<std::pair<uint64_t, uint32_t>> doomed;
  for (auto& [n, step] : job.steps) {
    if (cutoff && n < *cutoff) {
      for (auto& [r, shard] : step.shards) doomed.emplace_back(n, r);
    }
  }
  // Steps that can never be whole do not count towards retain_steps, so
  // without this a rank that fails every persist would fill the disk.
  for (uint64_t n :
       BrokenStepsToDrop(job.steps, options_.retain_steps, hosting))
    if (!cutoff || n >= *cutoff)
      for (auto& [r, shard] : job.steps[n].shards) doomed.emplace_back(n, r);
  for (auto [n, r] : doomed) DropShardLocked(job, n, r, /*delete_file=*/true);
}

bool Engine::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return persister_->Idle(); });
}

size_t Engine::Drain(std::chrono::milliseconds deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  cv_.notify_all();
  auto pending = [this] {
    size_t n = 0;
    for (const auto& [name, job] : jobs_)
      for (const auto& [s, step] : job.steps)
        for (const auto& [r, shard] : step.shards)
          if (shard.phase == ShardPhase::kStaged ||
              shard.phase == ShardPhase::kPersisting)
            ++n;
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + deadline;
  cv_.wait_until(lock, until,
                 [&] { return pending() == 0 && persister_->Idle(); });
  size_t left = pending();
  if (left == 0 && ObjectCommit()) {
    // The commit tier is the object store: wait for the uploads too.
    lock.unlock();
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (!uploader_->WaitIdle(
            std::max(remaining, std::chrono::milliseconds(0)))) {
      lock.lock();
      for (const auto& [name, job] : jobs_)
        for (const auto& [s, step] : job.steps)
          for (const auto& [r, shard] : step.shards)
            if (shard.phase == ShardPhase::kDurable && !shard.uploaded) ++left;
    }
  }
  return left;
}

}  // namespace ckpt::daemon
