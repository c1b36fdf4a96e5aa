// The job table's transitions that return their effects (effects.h): a
// commit, a persist's outcome, and the reports and tasks they derive.
// See job_table.h.
#include <memory>
#include <utility>
#include <vector>

#include "daemon/core/engine_util.h"
#include "daemon/state/job_table.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

ShardReport JobTable::ReportOf(const Shard& shard, bool durable,
                               bool failed) const {
  ShardReport r;
  r.job = shard.rec.job();
  r.step = shard.rec.step();
  r.rank = shard.rec.rank();
  r.durable = durable && !failed;
  r.failed = failed;
  if (shard.rec.has_generation()) r.generation = shard.rec.generation();
  r.trainer_started_ms = shard.trainer_started_ms;
  r.bytes = shard.rec.image_bytes();
  r.digest = storage::ChecksumsDigest(shard.info);
  r.staged_digest = shard.staged_digest.value_or(r.digest);
  if (const Job* job = Find(r.job)) r.owner_uid = job->rec.uid();
  if (durable) r.key = shard.rec.path();
  if (durable && !failed) {
    r.world_size = shard.rec.world_size();
    r.metas = std::make_shared<const std::vector<v1::TensorMeta>>(
        shard.rec.tensors().begin(), shard.rec.tensors().end());
  }
  return r;
}

std::optional<UploadTask> JobTable::UploadOf(const Job& job,
                                             const Shard& shard) {
  if (shard.uploaded || shard.phase != ShardPhase::kDurable)
    return std::nullopt;
  return UploadTask{UploadTask::kShard, job.rec.job(), shard.rec.step(),
                    shard.rec.rank(),   shard.gen,     shard.rec.image_bytes(),
                    {shard.rec.path()}};
}

bool JobTable::ManifestDue(const Job& job, uint64_t step_no) const {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end() || step->second.manifest) return false;
  // A step whose local copy retention deleted gets no local manifest again.
  for (const auto& [r, shard] : step->second.shards)
    if (shard.local_gone) return false;
  bool durable = false;
  return StepComplete(job, step->second, &durable) && durable;
}

std::optional<UploadTask> JobTable::ObjectManifestDue(const Job& job,
                                                      uint64_t step_no) const {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end() || step->second.object_manifest)
    return std::nullopt;
  bool durable = false;
  if (!StepComplete(job, step->second, &durable) || !durable)
    return std::nullopt;
  for (const auto& [r, shard] : step->second.shards)
    if (!shard.uploaded) return std::nullopt;
  const std::string& name = job.rec.job();
  return UploadTask{UploadTask::kManifest,
                    name,
                    step_no,
                    0,
                    0,
                    0,
                    {storage::ManifestKey(name, step_no, rules_.node_id)}};
}

Effects JobTable::Fail(Shard& shard, const std::string& error) {
  Effects fx;
  if (!FailShard(shard, error)) return fx;
  fx.edit.PutShard(shard.rec);
  fx.sync = true;
  fx.reports.push_back(ReportOf(shard, /*durable=*/false, /*failed=*/true));
  return fx;
}

Effects JobTable::Uploaded(const UploadTask& task, const std::string& key) {
  Effects fx;
  fx.wake_durable = true;  // WaitDurable in the object commit tier
  Shard* shard = FindShard(task.job, task.step, task.rank);
  if (shard == nullptr) {
    // Deleted while it was uploaded: the object must not outlive it.
    fx.object_deletes.push_back(
        UploadTask{UploadTask::kDelete, task.job, task.step, 0, 0, 0, {key}});
    return fx;
  }
  if (shard->gen != task.gen) return fx;  // replaced: its own upload follows
  shard->uploaded = true;
  shard->rec.set_uploaded(true);
  fx.edit.PutShard(shard->rec);
  fx.sync = false;
  if (rules_.object_commit)
    fx.reports.push_back(ReportOf(*shard, /*durable=*/true));
  if (auto manifest = ObjectManifestDue(*Find(task.job), task.step))
    fx.upload.push_back(std::move(*manifest));
  return fx;
}

Effects JobTable::Commit(Job& job, RankSlots& rank, uint32_t slot, Shard shard,
                         uint64_t* gen) {
  Effects fx;
  // Only the record, not synced: a staged shard lives in shared memory.
  fx.edit.PutShard(shard.rec);
  fx.sync = false;
  const uint64_t step = shard.rec.step();
  const uint32_t rank_no = shard.rec.rank();
  *gen = AddCommitted(job, rank, slot, std::move(shard));
  fx.reports.push_back(
      ReportOf(job.steps[step].shards[rank_no], /*durable=*/false));
  fx.persist.push_back(
      PersistTask{PersistTask::kShard, job.rec.job(), step, rank_no, *gen, {}});
  return fx;
}

JobTable::PersistResult JobTable::Persisted(
    const PersistTask& task, const std::string& key, PersistOutcome outcome,
    std::chrono::steady_clock::time_point now) {
  PersistResult r;
  Effects& fx = r.effects;
  fx.wake_slots = true;  // the slot frees or becomes durable
  fx.wake_durable = true;
  const absl::Status& s = outcome.status;
  Job* job = Find(task.job);
  Shard* shard = FindShard(task.job, task.step, task.rank);
  if (shard != nullptr && shard->gen != task.gen) shard = nullptr;
  if (shard == nullptr) {
    // Deleted or replaced while it was written: the file must not
    // outlive it, nor the slot the persist held.
    bool key_in_use = false;
    if (job != nullptr) {
      auto step = job->steps.find(task.step);
      key_in_use =
          step != job->steps.end() && step->second.shards.count(task.rank);
      for (auto& [n, rank] : job->ranks)
        for (uint32_t i = 0; n == task.rank && i < rank.slots.size(); ++i)
          if (rank.slots[i].state == shm::SlotState::kPersisting &&
              rank.slots[i].gen == 0 &&
              rank.arena->slot_data(i) == outcome.image) {
            rank.Free(i);
          }
    }
    r.verdict =
        PersistVerdictOf(false, key_in_use, s.code(), 0, rules_.persist_retry);
    if (r.verdict.delete_file) fx.deletes.push_back({task.job, task.step, key});
    fx.forget_job = true;
    return r;
  }
  RankSlots& rank = job->ranks[task.rank];
  if (!s.ok()) ++shard->attempts;
  r.attempts = shard->attempts;
  r.verdict = PersistVerdictOf(true, true, s.code(), shard->attempts,
                               rules_.persist_retry);
  switch (r.verdict.kind) {
    case PersistVerdict::kDurable:
      MoveShard(*job, *shard, ShardPhase::kDurable);
      shard->rec.set_path(key);
      shard->rec.clear_error();
      shard->info = std::move(outcome.info);
      ToTensorMetas(shard->info, shard->rec.mutable_tensors());
      r.bytes = shard->info.layout.image_bytes;
      // Recorded in order, outside the lock: should the daemon stop before
      // the record is written, recovery adopts the file.
      fx.edit.PutShard(shard->rec);
      fx.sync = true;
      if (rules_.upload)
        if (auto up = UploadOf(*job, *shard)) fx.upload.push_back(*up);
      if (!rules_.object_commit)
        fx.reports.push_back(ReportOf(*shard, /*durable=*/true));
      if (ManifestDue(*job, task.step))
        fx.persist.push_back(
            PersistTask{PersistTask::kManifest, task.job, task.step, 0, 0, {}});
      return r;
    case PersistVerdict::kAbandon:
      // The bytes are bad: the shard fails for good, and its step can
      // never be whole now, so retention may drop it.
      shard->rec.set_error(std::string(s.message()));
      rank.FailPersist(shard->slot);
      fx = Fail(*shard, std::string(s.message()));
      fx.wake_slots = true;
      fx.wake_durable = true;
      fx.retention = true;
      return r;
    default:
      break;
  }
  // The bytes are still in the slot: retry for as long as they are.
  shard->rec.set_error(std::string(s.message()));
  MoveShard(*job, *shard, ShardPhase::kStaged);
  if (r.verdict.release_slot)
    rank.FailPersist(shard->slot);  // a newer save may take the slot now
  PersistTask retry = task;
  retry.not_before = now + r.verdict.retry_after;
  fx.persist.push_back(std::move(retry));
  return r;
}

}  // namespace ckpt::daemon
