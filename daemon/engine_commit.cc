// CommitSave and the removal of shards. See engine.h.
#include <chrono>
#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status Engine::CommitSave(const PeerCreds& peer,
                                const v1::CommitSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  const Lease* found =
      leases_.FindFor(req.lease(), req.job(), req.rank(), /*write=*/true);
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no open save ", req.lease(),
                                            " of job '", req.job(), "' rank ",
                                            req.rank()));
  const Lease& lease = *found;
  if (lease.slot != req.slot())
    return absl::InvalidArgumentError(
        absl::StrCat("slot: ", req.slot(), " but lease ", req.lease(),
                     " is for slot ", lease.slot));
  if (lease.step != req.step())
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", req.step(), " but lease ", req.lease(),
                     " is for step ", lease.step));
  CKPT_ASSIGN_OR_RETURN(Rank * rank, FindRankLocked(*job, req.rank()));
  const uint32_t slot_no = req.slot();

  storage::ShardInfo info = ToShardInfo(req.job(), req.step(), req.rank(),
                                        job->rec.world_size(), req.tensors());
  info.created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  absl::Status valid = storage::ValidateShardInfo(&info);
  if (valid.ok() && info.layout.image_bytes > rank->arena->slot_bytes())
    valid = absl::ResourceExhaustedError(
        absl::StrCat("tensors: the shard needs ", info.layout.image_bytes,
                     " bytes, the slot holds ", rank->arena->slot_bytes()));
  if (valid.ok())
    valid = storage::EncodeShardMetadata(
        info, std::span<char>(rank->arena->slot_data(slot_no),
                              rank->arena->slot_bytes()));
  if (!valid.ok()) {
    ReleaseLeaseLocked(req.lease());  // the save is over; the slot frees
    return valid;
  }

  Shard shard;
  shard.rec.set_job(req.job());
  shard.rec.set_step(req.step());
  shard.rec.set_rank(req.rank());
  shard.rec.set_world_size(job->rec.world_size());
  shard.rec.set_state(CatalogStateOf(shard.phase));  // a commit starts staged
  shard.rec.set_slot(slot_no);
  shard.rec.set_image_bytes(info.layout.image_bytes);
  shard.rec.set_created_unix_ns(info.created_unix_ns);
  if (req.has_generation()) shard.rec.set_generation(req.generation());
  *shard.rec.mutable_tensors() = req.tensors();
  shard.slot = static_cast<int>(slot_no);
  shard.info = std::move(info);
  shard.staged_digest = storage::ChecksumsDigest(shard.info);

  // A save of step S starts a new timeline for this rank: its shards of
  // later steps (left over from before a rollback) go, and so does an
  // older shard of S itself. Their removal and the new record are one
  // catalog batch, written before anything changes here: a failed write
  // (a full disk) leaves every older save as it was.
  CatalogEdit edit;
  std::vector<DropPlan> drops;
  for (auto& [n, step] : job->steps)
    if (n >= req.step() && step.shards.count(req.rank()))
      drops.push_back(
          PlanDropLocked(*job, n, req.rank(), n != req.step(), edit));
  edit.PutShard(shard.rec);
  // Not synced when it only adds the record: a staged step lives in shared
  // memory, which a machine crash loses anyway; a daemon crash keeps the
  // page cache. Synced when it drops older saves (a re-save, a rollback):
  // their files are deleted next, and a record that came back after a
  // machine crash would name a file that is gone.
  if (absl::Status s = catalog_->Apply(edit, /*sync=*/!drops.empty());
      !s.ok()) {
    ReleaseLeaseLocked(req.lease());  // the save is over; the slot frees
    return s;
  }
  for (DropPlan& d : drops)
    ApplyDropLocked(*job, std::move(d), /*recorded=*/true);
  shard.gen = next_gen_++;

  rank->Hold(slot_no, SlotStateOf(shard.phase), req.step(), shard.gen,
             shard.info.layout.image_bytes);
  PersistTask task{PersistTask::kShard, req.job(), req.step(),
                   req.rank(),          shard.gen, {}};
  ReportLocked(shard, /*durable=*/false);
  const uint64_t shard_bytes = shard.info.layout.image_bytes;
  job->steps[req.step()].shards[req.rank()] = std::move(shard);
  job->forget_when_idle = false;
  using Seconds = std::chrono::duration<double>;
  metrics_->SaveCommitted(
      req.job(), Seconds(lease.granted - lease.begun).count(),
      Seconds(std::chrono::steady_clock::now() - lease.begun).count(),
      Seconds(arrived - lease.granted).count(), shard_bytes);
  ReleaseLeaseLocked(req.lease());
  persister_->Push(std::move(task));
  cv_.notify_all();
  return absl::OkStatus();
}

void Engine::DropShardLocked(Job& job, uint64_t step_no, uint32_t rank,
                             bool delete_file) {
  CatalogEdit edit;
  DropPlan plan = PlanDropLocked(job, step_no, rank, delete_file, edit);
  absl::Status s = catalog_->Apply(edit, /*sync=*/true);
  if (!s.ok()) LogWarning(std::string(s.message()));
  ApplyDropLocked(job, std::move(plan), s.ok());
}

Engine::DropPlan Engine::PlanDropLocked(const Job& job, uint64_t step_no,
                                        uint32_t rank, bool delete_file,
                                        CatalogEdit& edit) {
  DropPlan plan{step_no, rank, {}, std::nullopt};
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return plan;
  auto sh = step->second.shards.find(rank);
  if (sh == step->second.shards.end()) return plan;
  const std::string& name = job.rec.job();
  auto intent = [&](v1::DeleteIntent::Tier tier,
                    const std::vector<std::string>& keys, bool prefix) {
    v1::DeleteIntent d;
    d.set_tier(tier);
    for (const std::string& k : keys) d.add_keys(k);
    d.set_prefix(prefix);
    d.set_job(name);
    d.set_step(step_no);
    const uint64_t id = catalog_->NewIntentId();
    edit.PutDeleteIntent(id, d);
    return id;
  };
  auto local = [&](std::string key, bool prefix) {
    const uint64_t id = intent(v1::DeleteIntent::LOCAL, {key}, prefix);
    plan.local.push_back({std::move(key), prefix, id});
  };
  const bool was_durable =
      sh->second.phase == ShardPhase::kDurable && !sh->second.local_gone;
  const bool delete_object = delete_file && sh->second.uploaded;
  if (object_ != nullptr && (step->second.object_manifest || delete_object)) {
    // One ordered task: the object manifest goes before the shard. The
    // step is no longer whole, so its object manifest goes even when the
    // shard's key is about to be written again (a re-save of the step).
    UploadTask del{UploadTask::kDelete, name, step_no};
    if (step->second.object_manifest)
      del.keys.push_back(NodeManifestKey(name, step_no));
    if (delete_object) del.keys.push_back(sh->second.rec.path());
    del.intent = intent(v1::DeleteIntent::OBJECT, del.keys, false);
    plan.object = std::move(del);
  }
  // The intents go before the record deletes that made them due.
  // The step is no longer whole: its manifest goes first.
  if (step->second.manifest) local(NodeManifestKey(name, step_no), false);
  if (delete_file && was_durable)
    local(NodeShardKey(name, step_no, rank), false);
  // A shared root holds other nodes' files under the same prefix.
  if (step->second.shards.size() == 1 && delete_file &&
      options_.node_id.empty())
    local(storage::StepPrefix(name, step_no), true);
  edit.DeleteShard(name, step_no, rank);
  return plan;
}

void Engine::ApplyDropLocked(Job& job, DropPlan plan, bool recorded) {
  auto step = job.steps.find(plan.step);
  if (step == job.steps.end()) return;
  auto sh = step->second.shards.find(plan.rank);
  if (sh == step->second.shards.end()) return;
  auto r = job.ranks.find(plan.rank);
  if (r != job.ranks.end())
    r->second.DropShard(sh->second.slot, sh->second.gen);
  if (plan.object) {
    step->second.object_manifest = false;
    if (!recorded) plan.object->intent = 0;
    uploader_->Push(std::move(*plan.object));
  }
  step->second.shards.erase(sh);
  step->second.manifest = false;
  if (step->second.shards.empty()) job.steps.erase(step);
  for (LocalDelete& d : plan.local) {
    if (!recorded) d.intent = 0;  // still done, but not after a crash
    PushLocalDeleteLocked(std::move(d));
  }
  cv_.notify_all();
}

}  // namespace ckpt::daemon
