// Opening and closing the engine, Register, BeginSave, AbortSave, the
// hosted ranks and the reaper. See engine.h.
#include "daemon/engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/recovery.h"
#include "storage/shard_format.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(EngineOptions options,
                                                     storage::Backend* backend,
                                                     Catalog* catalog,
                                                     storage::Backend* object) {
  std::unique_ptr<Engine> engine(
      new Engine(std::move(options), backend, catalog, object));
  NodeState& node = engine->node_;
  node.Wire(&engine->pipeline_view_);
  CKPT_RETURN_IF_ERROR(RecoverFromCatalog(node));  // queues what is not durable
  node.pipeline->Start();
  node.metrics->SetSnapshotSource([&node] { return node.Gauges(); });
  engine->reaper_ = std::thread([e = engine.get()] { e->ReapLoop(); });
  return engine;
}

Engine::~Engine() {
  node_.metrics->SetSnapshotSource(nullptr);   // waits for a scrape
  node_.prefaulter.reset();                    // it publishes under the lock
  if (node_.pipeline) node_.pipeline->Stop();  // its tasks take the lock
  {
    Section lock(&node_);
    stopping_ = true;
  }
  node_.table.Wake(JobTable::Waiter::kReaper);
  if (reaper_.joinable()) reaper_.join();
  node_.writer.reset();       // writes what is queued
  node_.arena_drops.reset();  // lets go of the arenas dropped so far
  // Every other thread is gone; the lock only satisfies the analysis.
  JobTable::Lock table_lock(&node_.table);
  node_.table.ForEachJob([&](Job& job) {
    for (auto& [r, rank] : job.ranks)
      if (rank.arena && rank.registered)
        node_.backend->UnregisterMemory(rank.arena->slot_data(0));
  });
}

absl::StatusOr<v1::RegisterResponse> Engine::Register(
    const PeerCreds& peer, const v1::RegisterRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job()));
  if (req.world_size() == 0 || req.world_size() > node_.options.max_world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", req.world_size(), " is not in [1, ",
                     node_.options.max_world_size, "]"));
  if (req.rank() >= req.world_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", req.rank(), " is not below world_size ", req.world_size()));
  if (req.slot_bytes() == 0 || req.slot_bytes() > node_.options.max_slot_bytes)
    return absl::InvalidArgumentError(
        absl::StrCat("slot_bytes: ", req.slot_bytes(), " is not in [1, ",
                     node_.options.max_slot_bytes, "]"));
  uint32_t num_slots =
      req.num_slots() == 0 ? node_.options.default_num_slots : req.num_slots();
  if (num_slots < 2 || num_slots > shm::kMaxSlots)
    return absl::InvalidArgumentError(absl::StrCat(
        "num_slots: ", num_slots, " is not in [2, ", shm::kMaxSlots, "]"));

  Section lock(&node_);
  if (node_.draining) return absl::UnavailableError("ckptd is shutting down");
  CKPT_ASSIGN_OR_RETURN(
      Job * job,
      node_.table.FindOrAdd(req.job(), peer.uid, req.world_size(), num_slots,
                            req.has_generation()
                                ? std::optional<uint64_t>(req.generation())
                                : std::nullopt));
  job->forget_when_idle = false;
  auto ensured = node_.EnsureArena(req.job(), req.rank(), req.slot_bytes());
  if (!ensured.ok()) {
    node_.table.EraseIfUnrecorded(req.job());
    return ensured.status();
  }
  Rank* rank = *ensured;
  v1::RegisterResponse resp;
  resp.set_shm_name(rank->arena->name());
  resp.set_arena_bytes(rank->arena->size());
  resp.set_slot_bytes(rank->arena->slot_bytes());
  resp.set_num_slots(rank->arena->num_slots());
  resp.set_slots_offset(rank->arena->slot_offset(0));
  return resp;
}

absl::StatusOr<v1::BeginSaveResponse> Engine::BeginSave(
    const PeerCreds& peer, const v1::BeginSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  Section lock(&node_);
  if (node_.draining)
    return absl::UnavailableError("ckptd is shutting down: no new saves");
  CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
  CKPT_ASSIGN_OR_RETURN(Rank * rank, JobTable::FindRank(*job, req.rank()));
  // A save below the rank's newest step drops the newer steps (a new
  // timeline): only when asked to, or by the process that restored an
  // older step (a restarted trainer resuming). Checked per rank: ranks
  // commit a step at different times. Refused before any slot is taken,
  // so the trainer copies nothing and nothing changes.
  // Only a newer step some restore can return (complete on every rank)
  // blocks: a job that died before its first complete step restarts from
  // nothing, and its fast ranks' newer shards must not stop it.
  const std::vector<uint64_t> newer =
      ShardDrops::Newer(*job, req.step(), req.rank());
  std::vector<uint64_t> restorable;
  for (uint64_t n : newer) {
    bool durable = false;
    if (node_.table.StepComplete(*job, job->steps.at(n), &durable))
      restorable.push_back(n);
  }
  if (!restorable.empty() && !req.rewind()) {
    auto r = job->restored_by.find(req.rank());
    if (r == job->restored_by.end() || r->second.pid != peer.pid ||
        r->second.step > req.step())
      return BelowNewestError(req.job(), req.rank(), req.step(), restorable);
  }
  // A truncated arena cannot hold a save (its slots read zeros).
  CKPT_RETURN_IF_ERROR(rank->arena->CheckIntact());
  if (req.image_bytes() > rank->arena->slot_bytes())
    return absl::ResourceExhaustedError(absl::StrCat(
        "image_bytes: the shard needs ", req.image_bytes(),
        " bytes, the arena's slots hold ", rank->arena->slot_bytes()));
  auto start = std::chrono::steady_clock::now();
  auto timeout = req.timeout_ms() ? std::chrono::milliseconds(req.timeout_ms())
                                  : node_.options.default_busy_timeout;
  int slot = -1;
  for (;;) {
    // The rank may have been re-registered (arena replaced) while waiting.
    CKPT_ASSIGN_OR_RETURN(rank, JobTable::FindRank(*job, req.rank()));
    slot = rank->PickSlot();
    if (slot >= 0) break;
    if (!rank->reserve_error.ok())
      return absl::ResourceExhaustedError(absl::StrCat(
          "BUSY: every usable slot of job '", req.job(), "' rank ", req.rank(),
          " is taken; the others could not be reserved: ",
          rank->reserve_error.message()));
    // Slots still being readied by the prefaulter are not busy: wait for
    // them even when the caller does not want to block on busy slots.
    const bool readying = rank->ready_slots < rank->slots.size();
    if (!req.block() && !readying)
      return absl::ResourceExhaustedError(absl::StrCat(
          "BUSY: every slot of job '", req.job(), "' rank ", req.rank(),
          " is being written, persisted, read or holds the newest step"));
    if (!node_.table.WaitUntil(JobTable::Waiter::kSlot, start + timeout))
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no free slot for job '", req.job(), "' rank ",
                       req.rank(), " after waiting ", timeout.count(), " ms"));
    if (node_.draining)
      return absl::UnavailableError("ckptd is shutting down: no new saves");
    CKPT_ASSIGN_OR_RETURN(job, node_.table.FindFor(req.job(), peer));
  }
  Slot& s = rank->slots[slot];
  if (s.state == shm::SlotState::kDurable || s.reclaimable) {
    // The shard it held stays restorable from disk (if it is durable).
    for (auto [n, shard] : JobTable::DetachSlot(*job, req.rank(), slot)) {
      Shard& lost = *shard;
      if (lost.phase != ShardPhase::kStaged) continue;
      // Its persist kept failing, and now its bytes are gone.
      node_.metrics->Failure(metric::kPersistAbandoned);
      node_.FailShard(lost, absl::StrCat("its slot went to step ", req.step(),
                                         " while its persist kept failing: ",
                                         lost.rec.error()));
      LogWarning(absl::StrCat("job ", req.job(), " step ", n, " rank ",
                              req.rank(), ": ", lost.rec.error()));
    }
  }
  Lease lease{req.job(),  req.rank(), static_cast<uint32_t>(slot),
              req.step(), true,       peer.pid};
  // Allowed above (or asked for): the commit may drop newer steps.
  lease.rewind = req.rewind() || !newer.empty();
  lease.begun = arrived;
  lease.granted = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(uint64_t id,
                        node_.table.leases().Add(std::move(lease)));
  rank->BeginWrite(slot, req.step(), req.image_bytes(), id, peer.pid);
  v1::BeginSaveResponse resp;
  resp.set_slot(slot);
  resp.set_slot_offset(rank->arena->slot_offset(slot));
  resp.set_lease(id);
  resp.set_waited_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());
  return resp;
}

absl::Status Engine::AbortSave(const PeerCreds& peer,
                               const v1::AbortSaveRequest& req) {
  Section lock(&node_);
  CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
  (void)job;
  if (node_.table.leases().FindFor(req.lease(), req.job(), req.rank(),
                                   /*write=*/true) == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no save ", req.lease(),
                                            " of job '", req.job(), "' rank ",
                                            req.rank()));
  if (committing_.count(req.lease()))
    return absl::FailedPreconditionError(absl::StrCat(
        "lease: save ", req.lease(), " is being committed; too late to abort"));
  node_.ReleaseLease(req.lease());
  return absl::OkStatus();
}

EngineProgress Engine::Progress() const {
  EngineProgress p;
  p.reaper_ticks = reaper_ticks_.load(std::memory_order_relaxed);
  p.persist_progress = node_.persister->progress();
  p.persist_running = node_.persister->running();
  p.persists_queued = node_.persister->queued();
  return p;
}

void Engine::ReapLoop() {
  Section lock(&node_);
  while (!stopping_) {
    node_.table.WaitUntil(
        JobTable::Waiter::kReaper,
        std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
    for (uint64_t id : node_.table.leases().DeadHolders())
      node_.ReleaseLease(id);
    reaper_ticks_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Engine::SetHostedRanks(const std::string& job_name,
                            std::vector<uint32_t> ranks,
                            std::optional<uint64_t> keep_from) {
  Section lock(&node_);
  Hosting now{std::set<uint32_t>(ranks.begin(), ranks.end()), keep_from};
  if (!node_.table.SetHosting(job_name, std::move(now))) return;
  // Steps may have become complete here (ranks moved away), or deletable.
  Job* job = node_.table.Find(job_name);
  if (job == nullptr) return;
  for (auto& [n, step] : job->steps) node_.MaybeQueueManifest(*job, n);
  node_.ApplyRetention(*job);
}

void Engine::ReportRecovered() { daemon::ReportRecovered(node_); }

std::optional<UploadBacklog> Engine::ObjectBacklog() const {
  if (!node_.uploader) return std::nullopt;
  return node_.uploader->Backlog();
}

}  // namespace ckpt::daemon
