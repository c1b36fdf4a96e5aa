// CommitSave and the removal of shards. See engine.h.
#include <chrono>
#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/shard_format.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status Engine::CommitSave(const PeerCreds& peer, const v1::CommitSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  const Lease* found = leases_.FindFor(req.lease(), req.job(), req.rank(), /*write=*/true);
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no open save ", req.lease(), " of job '",
                                            req.job(), "' rank ", req.rank()));
  const Lease& lease = *found;
  if (lease.slot != req.slot())
    return absl::InvalidArgumentError(
        absl::StrCat("slot: ", req.slot(), " but lease ", req.lease(), " is for slot ", lease.slot));
  if (lease.step != req.step())
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", req.step(), " but lease ", req.lease(), " is for step ", lease.step));
  CKPT_ASSIGN_OR_RETURN(Rank * rank, FindRankLocked(*job, req.rank()));
  const uint32_t slot_no = req.slot();

  storage::ShardInfo info =
      ToShardInfo(req.job(), req.step(), req.rank(), job->rec.world_size(), req.tensors());
  info.created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  absl::Status valid = storage::ValidateShardInfo(&info);
  if (valid.ok() && info.layout.image_bytes > rank->arena->slot_bytes())
    valid = absl::ResourceExhaustedError(absl::StrCat(
        "tensors: the shard needs ", info.layout.image_bytes, " bytes, the slot holds ",
        rank->arena->slot_bytes()));
  if (valid.ok())
    valid = storage::EncodeShardMetadata(
        info, std::span<char>(rank->arena->slot_data(slot_no), rank->arena->slot_bytes()));
  if (!valid.ok()) {
    ReleaseLeaseLocked(req.lease());  // the save is over; the slot frees
    return valid;
  }

  // A save of step S starts a new timeline for this rank: its shards of
  // later steps (left over from before a rollback) go, and so does an
  // older shard of S itself.
  std::vector<uint64_t> superseded;
  for (auto& [n, step] : job->steps)
    if (n >= req.step() && step.shards.count(req.rank())) superseded.push_back(n);
  for (uint64_t n : superseded) DropShardLocked(*job, n, req.rank(), n != req.step());

  Shard shard;
  shard.rec.set_job(req.job());
  shard.rec.set_step(req.step());
  shard.rec.set_rank(req.rank());
  shard.rec.set_world_size(job->rec.world_size());
  shard.rec.set_state(v1::ShardRecord::STAGED);
  shard.rec.set_slot(slot_no);
  shard.rec.set_image_bytes(info.layout.image_bytes);
  shard.rec.set_created_unix_ns(info.created_unix_ns);
  *shard.rec.mutable_tensors() = req.tensors();
  shard.phase = ShardPhase::kStaged;
  shard.gen = next_gen_++;
  shard.slot = static_cast<int>(slot_no);
  shard.info = std::move(info);
  shard.staged_digest = ShardDigest(shard.rec.tensors());
  // Not synced: a staged step lives in shared memory, which a machine crash
  // loses anyway; a daemon crash keeps the page cache.
  CKPT_RETURN_IF_ERROR(catalog_->PutShard(shard.rec, /*sync=*/false));

  rank->Hold(slot_no, shm::SlotState::kStaged, req.step(), shard.gen,
             shard.info.layout.image_bytes);
  PersistTask task{PersistTask::kShard, req.job(), req.step(), req.rank(), shard.gen, {}};
  ReportLocked(shard, /*durable=*/false);
  const uint64_t shard_bytes = shard.info.layout.image_bytes;
  job->steps[req.step()].shards[req.rank()] = std::move(shard);
  job->forget_when_idle = false;
  using Seconds = std::chrono::duration<double>;
  metrics_->SaveCommitted(req.job(), Seconds(lease.granted - lease.begun).count(),
                          Seconds(std::chrono::steady_clock::now() - lease.begun).count(),
                          Seconds(arrived - lease.granted).count(), shard_bytes);
  ReleaseLeaseLocked(req.lease());
  persister_->Push(std::move(task));
  cv_.notify_all();
  return absl::OkStatus();
}

void Engine::DropShardLocked(Job& job, uint64_t step_no, uint32_t rank, bool delete_file) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return;
  auto sh = step->second.shards.find(rank);
  if (sh == step->second.shards.end()) return;
  auto r = job.ranks.find(rank);
  if (r != job.ranks.end()) r->second.DropShard(sh->second.slot, sh->second.gen);
  bool was_durable = sh->second.phase == ShardPhase::kDurable && !sh->second.local_gone;
  const bool delete_object = delete_file && sh->second.uploaded;
  if (object_ != nullptr && (step->second.object_manifest || delete_object)) {
    // One ordered task: the object manifest goes before the shard. The
    // step is no longer whole, so its object manifest goes even when the
    // shard's key is about to be written again (a re-save of the step).
    UploadTask del{UploadTask::kDelete, job.rec.job(), step_no};
    if (step->second.object_manifest) del.keys.push_back(NodeManifestKey(job.rec.job(), step_no));
    if (delete_object) del.keys.push_back(sh->second.rec.path());
    step->second.object_manifest = false;
    QueueObjectDeleteTaskLocked(std::move(del));
  }
  step->second.shards.erase(sh);
  absl::Status s = catalog_->DeleteShard(job.rec.job(), step_no, rank);
  if (!s.ok()) LogWarning(std::string(s.message()));
  if (step->second.manifest) {
    // The step is no longer whole: its manifest goes first.
    QueueLocalDeleteLocked(job.rec.job(), step_no, NodeManifestKey(job.rec.job(), step_no), false);
    step->second.manifest = false;
  }
  if (delete_file && was_durable)
    QueueLocalDeleteLocked(job.rec.job(), step_no, NodeShardKey(job.rec.job(), step_no, rank),
                           false);
  if (step->second.shards.empty()) {
    job.steps.erase(step);
    // A shared root holds other nodes' files under the same prefix.
    if (delete_file && options_.node_id.empty())
      QueueLocalDeleteLocked(job.rec.job(), step_no, storage::StepPrefix(job.rec.job(), step_no),
                             true);
  }
  cv_.notify_all();
}

}  // namespace ckpt::daemon
