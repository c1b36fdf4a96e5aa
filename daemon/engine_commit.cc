// CommitSave, and undoing a commit whose record could not be written. The
// drops a commit plans and applies are shard_drops.h's. See engine.h.
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
  std::unique_lock<std::mutex> lock(table_.mu());
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
  const Lease* found = table_.leases().FindFor(req.lease(), req.job(),
                                               req.rank(), /*write=*/true);
  if (found == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no open save ", req.lease(),
                                            " of job '", req.job(), "' rank ",
                                            req.rank()));
  if (committing_.count(req.lease()))
    return absl::FailedPreconditionError(absl::StrCat(
        "lease: save ", req.lease(), " is being committed already"));
  if (found->slot != req.slot())
    return absl::InvalidArgumentError(
        absl::StrCat("slot: ", req.slot(), " but lease ", req.lease(),
                     " is for slot ", found->slot));
  if (found->step != req.step())
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", req.step(), " but lease ", req.lease(),
                     " is for step ", found->step));
  CKPT_ASSIGN_OR_RETURN(Rank * rank, JobTable::FindRank(*job, req.rank()));
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
  // The job's uid may have truncated the arena: the tensors it wrote are
  // gone, and so is the metadata just written.
  if (valid.ok()) valid = rank->arena->CheckIntact();
  if (!valid.ok()) {
    ReleaseLeaseLocked(req.lease());  // the save is over; the slot frees
    return valid;
  }

  Shard shard;
  shard.rec.set_job(req.job());
  shard.rec.set_step(req.step());
  shard.rec.set_rank(req.rank());
  shard.rec.set_world_size(job->rec.world_size());
  shard.Start(ShardPhase::kStaged);  // a commit starts staged
  shard.rec.set_slot(slot_no);
  shard.rec.set_image_bytes(info.layout.image_bytes);
  shard.rec.set_created_unix_ns(info.created_unix_ns);
  if (req.has_generation())
    shard.rec.set_generation(req.generation());
  else
    shard.trainer_started_ms = peer.started_ms;
  *shard.rec.mutable_tensors() = req.tensors();
  shard.slot = static_cast<int>(slot_no);
  shard.info = std::move(info);
  shard.staged_digest = storage::ChecksumsDigest(shard.info);
  shard.rec.set_staged_digest(*shard.staged_digest);  // for a restart's reports

  // A save of step S starts a new timeline for this rank: its shards of
  // later steps (left over from before a rollback) go, and so does an
  // older shard of S itself. Their removal and the new record are one
  // catalog batch, written (synced: their files are deleted next, and a
  // record that came back after a machine crash would name a file that is
  // gone) before anything changes here, with the lock released: a failed write
  // (a full disk) leaves every older save as it was. Should the shards it
  // drops change meanwhile (a persist finished), the drops are planned
  // and written again from the new state.
  CatalogEdit edit;
  std::vector<DropPlan> drops =
      shard_drops_->PlanSuperseded(*job, req.step(), req.rank(), edit);
  std::vector<uint64_t> planned_intents;
  bool fast = drops.empty();
  uint64_t ticket = 0;
  while (!drops.empty()) {
    for (const DropPlan& d : drops) {
      for (const LocalDelete& l : d.local) planned_intents.push_back(l.intent);
      if (d.object) planned_intents.push_back(d.object->intent);
    }
    const std::vector<std::string> basis = ShardDrops::Basis(*job, drops);
    edit.PutShard(shard.rec);
    committing_.insert(req.lease());
    ticket = RecordLocked(std::move(edit), /*sync=*/true);
    lock.unlock();
    absl::Status s = writer_->Wait(ticket);
    lock.lock();
    committing_.erase(req.lease());
    auto j = table_.jobs().find(req.job());
    const bool leased =
        j != table_.jobs().end() &&
        table_.leases().FindFor(req.lease(), req.job(), req.rank(),
                                /*write=*/true) != nullptr;
    if (!s.ok()) {
      if (leased) ReleaseLeaseLocked(req.lease());  // the slot frees
      return s;
    }
    job = &j->second;
    edit = CatalogEdit();
    if (leased && ShardDrops::Basis(*job, drops) == basis) break;
    // The edit ran ahead of memory: its intents go, and the records of
    // what it deleted come back from memory (or are planned again).
    for (uint64_t id : planned_intents) edit.ForgetDeleteIntent(id);
    planned_intents.clear();
    if (!leased) {
      for (const DropPlan& d : drops) {
        const Shard* sh = table_.FindShard(req.job(), d.step, d.rank);
        if (sh != nullptr) edit.PutShard(sh->rec);
      }
      if (table_.FindShard(req.job(), req.step(), req.rank()) == nullptr)
        edit.DeleteShard(req.job(), req.step(), req.rank());
      RecordLocked(std::move(edit), /*sync=*/true);
      return absl::NotFoundError(
          absl::StrCat("lease: save ", req.lease(), " of job '", req.job(),
                       "' rank ", req.rank(), " ended while it committed"));
    }
    drops = shard_drops_->PlanSuperseded(*job, req.step(), req.rank(), edit);
    if (drops.empty()) edit.PutShard(shard.rec);
  }
  CKPT_ASSIGN_OR_RETURN(rank, JobTable::FindRank(*job, req.rank()));
  for (DropPlan& d : drops) shard_drops_->Apply(*job, std::move(d), 0);
  if (fast || !edit.empty()) {
    // Only the new record (kMemoryOnly: a staged step lives in shared
    // memory). Memory changes now, in the same critical section as the
    // edit is queued, and a write that fails undoes the commit.
    if (fast) edit.PutShard(shard.rec);
    ticket = RecordLocked(std::move(edit), fast ? kMemoryOnly : true);
  } else {
    ticket = 0;  // written above
  }
  const Lease lease = *table_.leases().Find(req.lease());
  const uint64_t shard_bytes = shard.info.layout.image_bytes;
  const uint64_t gen =
      table_.AddCommitted(*job, *rank, slot_no, std::move(shard));
  ReportLocked(job->steps[req.step()].shards[req.rank()], /*durable=*/false);
  PersistTask task{PersistTask::kShard, req.job(), req.step(),
                   req.rank(),          gen,       {}};
  using Seconds = std::chrono::duration<double>;
  metrics_->SaveCommitted(
      req.job(), Seconds(lease.granted - lease.begun).count(),
      Seconds(std::chrono::steady_clock::now() - lease.begun).count(),
      Seconds(arrived - lease.granted).count(), shard_bytes);
  ReleaseLeaseLocked(req.lease());
  persister_->Push(std::move(task));
  if (ticket == 0) return absl::OkStatus();
  lock.unlock();
  absl::Status s = writer_->Wait(ticket);
  if (s.ok()) return s;
  lock.lock();
  UndoCommitLocked(req.job(), req.step(), req.rank(), gen);
  return s;
}

void Engine::UndoCommitLocked(const std::string& job_name, uint64_t step,
                              uint32_t rank, uint64_t gen) {
  Shard* shard = table_.FindShard(job_name, step, rank);
  auto job = table_.jobs().find(job_name);
  if (shard == nullptr || shard->gen != gen || job == table_.jobs().end())
    return;
  ReportLocked(*shard, /*durable=*/false, /*failed=*/true);
  DropShardLocked(job->second, step, rank, /*delete_file=*/true);
  MaybeForgetJobLocked(job_name);
}

}  // namespace ckpt::daemon
