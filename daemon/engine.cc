// Opening and closing the engine, Register, BeginSave, AbortSave, leases
// and the reaper. See engine.h.
#include "daemon/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/engine_util.h"
#include "storage/shard_format.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

Engine::Engine(EngineOptions options, storage::Backend* backend,
               Catalog* catalog, storage::Backend* object)
    : options_(std::move(options)),
      metrics_(options_.metrics ? options_.metrics
                                : std::make_shared<DaemonMetrics>()),
      backend_(backend),
      catalog_(catalog),
      object_(object),
      started_(std::chrono::steady_clock::now()),
      table_(JobTable::Rules{
          PersistRetryPolicy{options_.max_persist_attempts,
                             options_.persist_retry_delay,
                             options_.persist_retry_max_delay},
          object != nullptr,
          object != nullptr &&
              options_.commit_tier == EngineOptions::CommitTier::kObject,
          options_.node_id}) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(EngineOptions options,
                                                     storage::Backend* backend,
                                                     Catalog* catalog,
                                                     storage::Backend* object) {
  std::unique_ptr<Engine> engine(
      new Engine(std::move(options), backend, catalog, object));
  engine->writer_ = std::make_unique<CatalogWriter>(catalog);
  engine->arena_drops_ = std::make_unique<ArenaDrops>(backend);
  engine->pipeline_ = std::make_unique<PersistPipeline>(
      static_cast<PipelineState*>(engine.get()), backend, object,
      engine->options_.upload_threads, catalog, engine->writer_.get(),
      engine->options_.node_id, engine->options_.clock);
  engine->persister_ = &engine->pipeline_->persist();
  engine->uploader_ = engine->pipeline_->upload();
  engine->shard_drops_ = std::make_unique<ShardDrops>(
      &engine->table_, catalog, engine->writer_.get(), engine->persister_,
      engine->uploader_, engine->options_.node_id);
  engine->prefaulter_ = std::make_unique<Prefaulter>(&engine->table_, backend);
  CKPT_RETURN_IF_ERROR(engine->Recover());  // queues what is not yet durable
  engine->pipeline_->Start();
  engine->metrics_->SetSnapshotSource(
      [e = engine.get()] { return e->Snapshot(); });
  engine->reaper_ = std::thread([e = engine.get()] { e->ReapLoop(); });
  return engine;
}

Engine::~Engine() {
  metrics_->SetSnapshotSource(nullptr);  // waits for a scrape in progress
  prefaulter_.reset();                   // it publishes under the lock
  if (pipeline_) pipeline_->Stop();      // its tasks take the lock
  {
    Section lock(this);
    stopping_ = true;
  }
  table_.Wake(JobTable::Waiter::kReaper);
  if (reaper_.joinable()) reaper_.join();
  writer_.reset();       // writes what is queued
  arena_drops_.reset();  // lets go of the arenas dropped so far
  // Every other thread is gone; the lock only satisfies the analysis.
  JobTable::Lock table_lock(&table_);
  table_.ForEachJob([&](Job& job) {
    for (auto& [r, rank] : job.ranks)
      if (rank.arena && rank.registered)
        backend_->UnregisterMemory(rank.arena->slot_data(0));
  });
}

Engine::Section::Section(Engine* engine) ABSL_NO_THREAD_SAFETY_ANALYSIS
    : engine_(engine),
      lock_(&engine->table_) {}

// The analysis follows lock_ inside, not the capability Section stands for.
Engine::Section::~Section() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (held_) Unlock();
}

void Engine::Section::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint64_t upto = engine_->queued_reports_;
  lock_.Unlock();
  held_ = false;
  engine_->Deliver(upto);
}

void Engine::Section::Relock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  lock_.Relock();
  held_ = true;
}

void Engine::Outbox(Report report) {
  const bool wanted = std::holds_alternative<ShardReport>(report)
                          ? static_cast<bool>(options_.on_shard)
                          : static_cast<bool>(options_.on_fallback);
  if (!wanted) return;
  outbox_.push_back(std::move(report));
  ++queued_reports_;
}

void Engine::Deliver(uint64_t upto) {
  if (delivered_reports_.load(std::memory_order_acquire) >= upto) return;
  // One deliverer at a time, so that reports reach the node agent in the
  // order of the changes; whoever comes first delivers the others' too.
  absl::MutexLock order(&deliver_mu_);
  if (delivered_reports_.load(std::memory_order_acquire) >= upto) return;
  std::vector<Report> out;
  {
    JobTable::Lock lock(&table_);
    out.swap(outbox_);
  }
  for (const Report& r : out) {
    if (const ShardReport* shard = std::get_if<ShardReport>(&r))
      options_.on_shard(*shard);
    else
      options_.on_fallback(std::get<FallbackReport>(r));
  }
  delivered_reports_.fetch_add(out.size(), std::memory_order_release);
}

uint64_t Engine::Apply(Effects& fx) {
  uint64_t ticket = 0;
  if (!fx.edit.empty()) ticket = QueueEdit(std::move(fx.edit), fx.sync);
  fx.edit = CatalogEdit();
  for (OwedDelete& d : fx.deletes)
    shard_drops_->QueueLocalDelete(d.job, d.step, std::move(d.key), false);
  fx.deletes.clear();
  for (UploadTask& del : fx.object_deletes)
    shard_drops_->QueueObjectDelete(std::move(del));
  fx.object_deletes.clear();
  for (ShardReport& r : fx.reports) Outbox(std::move(r));
  fx.reports.clear();
  return ticket;
}

void Engine::Perform(Effects fx) {
  for (PersistTask& t : fx.persist) persister_->Push(std::move(t));
  for (UploadTask& t : fx.upload) uploader_->Push(std::move(t));
  if (fx.wake_slots) table_.Wake(JobTable::Waiter::kSlot);
  if (fx.wake_durable) table_.Wake(JobTable::Waiter::kDurable);
}

void Engine::MaybeForgetJob(const std::string& name) {
  Job* found = table_.Find(name);
  if (found == nullptr || !found->forget_when_idle) return;
  Job& job = *found;
  if (!table_.Unused(job)) return;
  std::vector<uint32_t> ranks;
  for (const auto& [r, rank] : job.ranks) ranks.push_back(r);
  for (uint32_t r : ranks) DropArena(job, r, /*unlink=*/true);
  CatalogEdit edit;
  edit.DeleteJob(name);
  QueueEdit(std::move(edit), /*sync=*/true);
  LogInfo(absl::StrCat("job ", name,
                       ": every step deleted; record and arenas removed"));
  table_.Erase(name);
  metrics_->ForgetJob(name);
  table_.Wake(JobTable::Waiter::kSlot);
  table_.Wake(JobTable::Waiter::kDurable);
}

absl::StatusOr<v1::RegisterResponse> Engine::Register(
    const PeerCreds& peer, const v1::RegisterRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job()));
  if (req.world_size() == 0 || req.world_size() > options_.max_world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", req.world_size(), " is not in [1, ",
                     options_.max_world_size, "]"));
  if (req.rank() >= req.world_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", req.rank(), " is not below world_size ", req.world_size()));
  if (req.slot_bytes() == 0 || req.slot_bytes() > options_.max_slot_bytes)
    return absl::InvalidArgumentError(
        absl::StrCat("slot_bytes: ", req.slot_bytes(), " is not in [1, ",
                     options_.max_slot_bytes, "]"));
  uint32_t num_slots =
      req.num_slots() == 0 ? options_.default_num_slots : req.num_slots();
  if (num_slots < 2 || num_slots > shm::kMaxSlots)
    return absl::InvalidArgumentError(absl::StrCat(
        "num_slots: ", num_slots, " is not in [2, ", shm::kMaxSlots, "]"));

  Section lock(this);
  if (draining_) return absl::UnavailableError("ckptd is shutting down");
  CKPT_ASSIGN_OR_RETURN(
      Job * job,
      table_.FindOrAdd(req.job(), peer.uid, req.world_size(), num_slots));
  job->forget_when_idle = false;
  auto ensured = EnsureArena(req.job(), req.rank(), req.slot_bytes());
  if (!ensured.ok()) {
    table_.EraseIfUnrecorded(req.job());
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

void Engine::ReleaseLease(uint64_t id) {
  std::optional<Lease> lease = table_.ReleaseLease(id);
  if (!lease) return;
  // A FILE restore is over: the deletes it held back go now.
  if (!lease->file_key.empty()) shard_drops_->ReleaseDeferred();
  MaybeForgetJob(lease->job);
}

absl::StatusOr<v1::BeginSaveResponse> Engine::BeginSave(
    const PeerCreds& peer, const v1::BeginSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  Section lock(this);
  if (draining_)
    return absl::UnavailableError("ckptd is shutting down: no new saves");
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
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
    if (table_.StepComplete(*job, job->steps.at(n), &durable))
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
                                  : options_.default_busy_timeout;
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
    if (!table_.WaitUntil(JobTable::Waiter::kSlot, start + timeout))
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no free slot for job '", req.job(), "' rank ",
                       req.rank(), " after waiting ", timeout.count(), " ms"));
    if (draining_)
      return absl::UnavailableError("ckptd is shutting down: no new saves");
    CKPT_ASSIGN_OR_RETURN(job, table_.FindFor(req.job(), peer));
  }
  Slot& s = rank->slots[slot];
  if (s.state == shm::SlotState::kDurable || s.reclaimable) {
    // The shard it held stays restorable from disk (if it is durable).
    for (auto [n, shard] : JobTable::DetachSlot(*job, req.rank(), slot)) {
      Shard& lost = *shard;
      if (lost.phase != ShardPhase::kStaged) continue;
      // Its persist kept failing, and now its bytes are gone.
      metrics_->Failure(metric::kPersistAbandoned);
      FailShard(lost, absl::StrCat("its slot went to step ", req.step(),
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
  CKPT_ASSIGN_OR_RETURN(uint64_t id, table_.leases().Add(std::move(lease)));
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
  Section lock(this);
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
  (void)job;
  if (table_.leases().FindFor(req.lease(), req.job(), req.rank(),
                              /*write=*/true) == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no save ", req.lease(),
                                            " of job '", req.job(), "' rank ",
                                            req.rank()));
  if (committing_.count(req.lease()))
    return absl::FailedPreconditionError(absl::StrCat(
        "lease: save ", req.lease(), " is being committed; too late to abort"));
  ReleaseLease(req.lease());
  return absl::OkStatus();
}

EngineProgress Engine::Progress() const {
  EngineProgress p;
  p.reaper_ticks = reaper_ticks_.load(std::memory_order_relaxed);
  p.persist_progress = persister_->progress();
  p.persist_running = persister_->running();
  p.persists_queued = persister_->queued();
  return p;
}

void Engine::ReapLoop() {
  Section lock(this);
  while (!stopping_) {
    table_.WaitUntil(
        JobTable::Waiter::kReaper,
        std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
    for (uint64_t id : table_.leases().DeadHolders()) ReleaseLease(id);
    reaper_ticks_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ckpt::daemon
