// What the engine answers about its state without changing it:
// WaitDurable (waits for a shard to be durable in the commit tier), List
// and Status. See engine.h.
#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/engine.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::Status Engine::WaitDurable(const PeerCreds& peer,
                                 const v1::WaitDurableRequest& req) {
  Section lock(&node_);
  auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(req.timeout_ms() ? req.timeout_ms() : 600000);
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
    (void)job;
    const Shard* found =
        node_.table.FindShard(req.job(), req.step(), req.rank());
    if (found == nullptr)
      return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                              "' has no step ", req.step(),
                                              " for rank ", req.rank()));
    const Shard& shard = *found;
    if (node_.CommitDurable(shard)) {
      // As durable in the catalog as on storage: the record of it (queued
      // with the change, written outside the lock) is written when we answer.
      lock.Unlock();
      node_.writer->Flush();
      return absl::OkStatus();
    }
    if (shard.phase == ShardPhase::kFailed)
      return absl::DataLossError(absl::StrCat("persist of step ", req.step(),
                                              " rank ", req.rank(),
                                              " failed: ", shard.rec.error()));
    if (!node_.table.WaitUntil(JobTable::Waiter::kDurable, deadline)) {
      const Shard* now =
          node_.table.FindShard(req.job(), req.step(), req.rank());
      // Staged, or in its next attempt at this instant: it keeps failing
      // either way.
      if (now != nullptr &&
          (now->phase == ShardPhase::kStaged ||
           now->phase == ShardPhase::kPersisting) &&
          now->attempts >= node_.options.max_persist_attempts)
        return absl::UnavailableError(
            absl::StrCat("persist of step ", req.step(), " rank ", req.rank(),
                         " keeps failing (", now->attempts,
                         " attempts; retried while its bytes are in memory): ",
                         now->rec.error()));
      return absl::DeadlineExceededError(
          absl::StrCat("step ", req.step(), " rank ", req.rank(),
                       " not durable within the timeout"));
    }
  }
}

absl::StatusOr<v1::ListResponse> Engine::List(const PeerCreds& peer,
                                              const v1::ListRequest& req) {
  Section lock(&node_);
  v1::ListResponse resp;
  if (!req.job().empty()) {
    // A job whose steps were all deleted has no record left: listed empty.
    absl::Status found = node_.table.FindFor(req.job(), peer).status();
    if (absl::IsNotFound(found)) return resp;
    CKPT_RETURN_IF_ERROR(found);
  }
  for (const Job* visible : node_.table.Visible(peer.uid, req.job())) {
    const Job& job = *visible;
    if (!job.recorded) continue;  // a first Register is still creating it
    v1::JobInfo* ji = resp.add_jobs();
    ji->set_job(job.rec.job());
    ji->set_world_size(job.rec.world_size());
    ji->set_uid(job.rec.uid());
    for (const auto& [n, step] : job.steps) {
      v1::StepInfo* si = ji->add_steps();
      si->set_step(n);
      bool durable = false;
      si->set_complete(node_.table.StepComplete(job, step, &durable));
      si->set_durable(durable && (node_.ObjectCommit()
                                      ? step.object_manifest
                                      : step.manifest || step.object_manifest));
      for (const auto& [r, shard] : step.shards) {
        v1::ShardInfo* sh = si->add_shards();
        sh->set_rank(r);
        sh->set_state(RpcStateOf(shard.phase));
        sh->set_bytes(shard.rec.image_bytes());
        sh->set_path(shard.rec.path());
        sh->set_in_memory(shard.slot >= 0);
        sh->set_error(shard.rec.error());
      }
    }
  }
  return resp;
}

v1::StatusResponse Engine::Status(const PeerCreds& peer) {
  Section lock(&node_);
  v1::StatusResponse resp;
  resp.set_uptime_s(std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - node_.started)
                        .count());
  resp.set_backend(node_.backend->name());
  uint64_t in_flight = 0;
  // Other uids' jobs are not shown (as in List); the counters are global.
  node_.table.ForEachVisible(peer.uid, /*only=*/"", [&](const Job& job) {
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.arena) continue;
      v1::ArenaStatus* a = resp.add_arenas();
      a->set_job(job.rec.job());
      a->set_rank(r);
      a->set_shm_name(rank.arena->name());
      a->set_arena_bytes(rank.arena->size());
      for (const Slot& s : rank.slots) {
        v1::SlotStatus* st = a->add_slots();
        st->set_state(RpcSlotStateOf(s.state));
        if (s.state != shm::SlotState::kFree) st->set_step(s.step);
        st->set_readers(s.readers);
      }
    }
    in_flight += JobTable::InFlightOf(job).bytes;
  });
  resp.set_bytes_in_flight(in_flight);
  for (const OwnedEvent& e : events_)
    if (peer.uid == 0 || peer.uid == e.uid) *resp.add_events() = e.event;
  resp.set_persist_queue(static_cast<uint32_t>(node_.persister->Size()));
  resp.set_persisted_shards(node_.persisted_shards);
  resp.set_persisted_bytes(node_.persisted_bytes);
  resp.set_failed_persists(node_.failed_persists);
  if (std::optional<UploadBacklog> b = ObjectBacklog()) {
    resp.set_object_tier(node_.object->name());
    resp.set_commit_tier(node_.ObjectCommit() ? "object" : "local");
    resp.set_upload_backlog_steps(b->steps);
    resp.set_upload_backlog_shards(b->shards);
    resp.set_upload_backlog_bytes(b->bytes);
    resp.set_uploaded_shards(b->uploaded_shards);
    resp.set_uploaded_bytes(b->uploaded_bytes);
    resp.set_failed_uploads(b->failed);
    resp.set_last_upload_error(b->last_error);
    resp.set_last_upload_s(b->last_upload_s);
  }
  return resp;
}

}  // namespace ckpt::daemon
