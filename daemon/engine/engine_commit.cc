// CommitSave, and undoing a commit whose record could not be written. The
// drops a commit plans and applies are shard_drops.h's. See engine.h.
#include <chrono>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/engine.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status Engine::CommitSave(const PeerCreds& peer,
                                const v1::CommitSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  Section lock(&node_);
  CKPT_ASSIGN_OR_RETURN(const Lease lease, CommitLease(peer, req));
  // A newer step of this rank committed after BeginSave (another process
  // saving the rank) is not dropped unless BeginSave allowed a rewind.
  const std::vector<uint64_t> newer =
      ShardDrops::Newer(*node_.table.Find(req.job()), req.step(), req.rank());
  if (!newer.empty() && !lease.rewind)
    return BelowNewestError(req.job(), req.rank(), req.step(), newer);
  CKPT_ASSIGN_OR_RETURN(Shard shard, StageShard(req));
  // Without a generation, the trainer's start fences it (ShardReport).
  if (!req.has_generation()) shard.trainer_started_ms = peer.started_ms;
  CKPT_ASSIGN_OR_RETURN(Superseded sup, WriteSuperseded(req, shard.rec));
  Job& job = *sup.job;
  CKPT_ASSIGN_OR_RETURN(Rank * rank, JobTable::FindRank(job, req.rank()));
  for (DropPlan& d : sup.drops) node_.shard_drops->Apply(job, std::move(d), 0);
  const uint64_t bytes = shard.info.layout.image_bytes;
  uint64_t gen = 0;
  Effects fx =
      node_.table.Commit(job, *rank, req.slot(), std::move(shard), &gen);
  ChainEdit(std::move(sup), &fx);
  const uint64_t ticket = node_.Apply(fx);
  if (!newer.empty()) NoteRollback(job, req, newer, lease.pid);
  NoteCommitted(req.job(), lease, arrived, bytes);
  node_.ReleaseLease(req.lease());
  lock.Unlock();
  node_.Perform(std::move(fx));
  if (ticket == 0) return absl::OkStatus();
  // Memory changed with the edit queued; a write that fails undoes it.
  absl::Status s = node_.writer->Wait(ticket);
  if (s.ok()) return s;
  lock.Relock();
  UndoCommit(req.job(), req.step(), req.rank(), gen);
  return s;
}

void Engine::ChainEdit(Superseded sup, Effects* fx) {
  if (sup.written) {
    fx->edit = CatalogEdit();  // the record went with the drops' edit
  } else if (!sup.fast) {
    sup.edit.Append(std::move(fx->edit));  // the drops planned again first
    fx->edit = std::move(sup.edit);
    fx->sync = true;
  }
}

void Engine::NoteRollback(Job& job, const v1::CommitSaveRequest& req,
                          const std::vector<uint64_t>& newer, pid_t pid) {
  LogWarning(absl::StrCat("job ", req.job(), " rank ", req.rank(),
                          ": rollback from step ", newer.back(), " to ",
                          req.step(),
                          "; steps dropped: ", absl::StrJoin(newer, ", ")));
  node_.metrics->Rollback();
  RecordRollback(job, req, newer);
  // A resuming trainer's allowance is used up: the steps it saves from now
  // on are its own timeline.
  auto r = job.restored_by.find(req.rank());
  if (r != job.restored_by.end() && r->second.pid == pid)
    job.restored_by.erase(r);
}

void Engine::NoteCommitted(const std::string& job, const Lease& lease,
                           std::chrono::steady_clock::time_point arrived,
                           uint64_t bytes) {
  using Seconds = std::chrono::duration<double>;
  node_.metrics->SaveCommitted(
      job, Seconds(lease.granted - lease.begun).count(),
      Seconds(std::chrono::steady_clock::now() - lease.begun).count(),
      Seconds(arrived - lease.granted).count(), bytes);
}

void Engine::RecordRollback(const Job& job, const v1::CommitSaveRequest& req,
                            const std::vector<uint64_t>& dropped) {
  v1::DaemonEvent e;
  e.set_kind("ROLLBACK");
  e.set_job(req.job());
  e.set_rank(req.rank());
  e.set_from_step(dropped.back());
  e.set_to_step(req.step());
  for (uint64_t n : dropped) e.add_dropped_steps(n);
  e.set_unix_time_s(std::chrono::duration<double>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count());
  events_.push_back({job.rec.uid(), std::move(e)});
  if (events_.size() > kMaxEvents) events_.pop_front();
}

absl::StatusOr<Lease> Engine::CommitLease(const PeerCreds& peer,
                                          const v1::CommitSaveRequest& req) {
  CKPT_RETURN_IF_ERROR(node_.table.FindFor(req.job(), peer).status());
  const Lease* found = node_.table.leases().FindFor(req.lease(), req.job(),
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
  return *found;
}

absl::StatusOr<Shard> Engine::StageShard(const v1::CommitSaveRequest& req) {
  Job& job = *node_.table.Find(req.job());
  CKPT_ASSIGN_OR_RETURN(Rank * rank, JobTable::FindRank(job, req.rank()));
  const uint32_t slot_no = req.slot();
  storage::ShardInfo info = ToShardInfo(req.job(), req.step(), req.rank(),
                                        job.rec.world_size(), req.tensors());
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
    node_.ReleaseLease(req.lease());  // the save is over; the slot frees
    return valid;
  }

  Shard shard;
  shard.rec.set_job(req.job());
  shard.rec.set_step(req.step());
  shard.rec.set_rank(req.rank());
  shard.rec.set_world_size(job.rec.world_size());
  shard.Start(ShardPhase::kStaged);  // a commit starts staged
  shard.rec.set_slot(slot_no);
  shard.rec.set_image_bytes(info.layout.image_bytes);
  shard.rec.set_created_unix_ns(info.created_unix_ns);
  if (req.has_generation()) shard.rec.set_generation(req.generation());
  *shard.rec.mutable_tensors() = req.tensors();
  shard.slot = static_cast<int>(slot_no);
  shard.info = std::move(info);
  shard.staged_digest = storage::ChecksumsDigest(shard.info);
  shard.rec.set_staged_digest(*shard.staged_digest);  // for a restart's reports
  return shard;
}

// A save of step S starts a new timeline for this rank: its shards of
// later steps (left over from before a rollback) go, and so does an older
// shard of S itself. Their removal and the new record are one catalog
// batch, written (synced: their files are deleted next, and a record that
// came back after a machine crash would name a file that is gone) before
// anything changes here, with the lock released: a failed write (a full
// disk) leaves every older save as it was. Should the shards it drops
// change meanwhile (a persist finished), the drops are planned and written
// again from the new state.
absl::StatusOr<Engine::Superseded> Engine::WriteSuperseded(
    const v1::CommitSaveRequest& req, const catv1::ShardRecord& rec) {
  Superseded sup;
  sup.job = node_.table.Find(req.job());
  sup.drops = node_.shard_drops->PlanSuperseded(*sup.job, req.step(),
                                                req.rank(), sup.edit);
  sup.fast = sup.drops.empty();
  std::vector<uint64_t> planned_intents;
  while (!sup.drops.empty()) {
    for (const DropPlan& d : sup.drops) {
      for (const LocalDelete& l : d.local) planned_intents.push_back(l.intent);
      if (d.object) planned_intents.push_back(d.object->intent);
    }
    const std::vector<std::string> basis =
        ShardDrops::Basis(*sup.job, sup.drops);
    sup.edit.PutShard(rec);
    committing_.insert(req.lease());
    const uint64_t ticket = node_.QueueEdit(std::move(sup.edit), /*sync=*/true);
    node_.table.Unlock();
    absl::Status s = node_.writer->Wait(ticket);
    node_.table.Relock();
    committing_.erase(req.lease());
    sup.job = node_.table.Find(req.job());
    const bool leased =
        sup.job != nullptr &&
        node_.table.leases().FindFor(req.lease(), req.job(), req.rank(),
                                     /*write=*/true) != nullptr;
    if (!s.ok()) {
      if (leased) node_.ReleaseLease(req.lease());  // the slot frees
      return s;
    }
    sup.edit = CatalogEdit();
    if (leased && ShardDrops::Basis(*sup.job, sup.drops) == basis) {
      sup.written = true;
      break;
    }
    // The edit ran ahead of memory: its intents go, and the records of
    // what it deleted come back from memory (or are planned again).
    for (uint64_t id : planned_intents) sup.edit.ForgetDeleteIntent(id);
    planned_intents.clear();
    if (!leased) {
      for (const DropPlan& d : sup.drops) {
        const Shard* sh = node_.table.FindShard(req.job(), d.step, d.rank);
        if (sh != nullptr) sup.edit.PutShard(sh->rec);
      }
      if (node_.table.FindShard(req.job(), req.step(), req.rank()) == nullptr)
        sup.edit.DeleteShard(req.job(), req.step(), req.rank());
      node_.QueueEdit(std::move(sup.edit), /*sync=*/true);
      return absl::NotFoundError(
          absl::StrCat("lease: save ", req.lease(), " of job '", req.job(),
                       "' rank ", req.rank(), " ended while it committed"));
    }
    sup.drops = node_.shard_drops->PlanSuperseded(*sup.job, req.step(),
                                                  req.rank(), sup.edit);
  }
  return sup;
}

void Engine::UndoCommit(const std::string& job_name, uint64_t step,
                        uint32_t rank, uint64_t gen) {
  Shard* shard = node_.table.FindShard(job_name, step, rank);
  Job* job = node_.table.Find(job_name);
  if (shard == nullptr || shard->gen != gen || job == nullptr) return;
  node_.ReportShard(*shard, /*durable=*/false, /*failed=*/true);
  node_.DropShard(*job, step, rank, /*delete_file=*/true);
  node_.MaybeForgetJob(job_name);
}

}  // namespace ckpt::daemon
