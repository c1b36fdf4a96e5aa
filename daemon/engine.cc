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
      started_(std::chrono::steady_clock::now()) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(EngineOptions options,
                                                     storage::Backend* backend,
                                                     Catalog* catalog,
                                                     storage::Backend* object) {
  std::unique_ptr<Engine> engine(
      new Engine(std::move(options), backend, catalog, object));
  engine->writer_ = std::make_unique<CatalogWriter>(catalog);
  engine->pipeline_ = std::make_unique<PersistPipeline>(
      static_cast<PipelineState*>(engine.get()), &engine->mu_,
      &engine->queue_cv_, &engine->durable_cv_, backend, object,
      engine->options_.upload_threads, catalog, engine->writer_.get(),
      engine->options_.node_id);
  engine->persister_ = &engine->pipeline_->persist();
  engine->uploader_ = engine->pipeline_->upload();
  engine->prefaulter_ = std::make_unique<Prefaulter>(
      [e = engine.get()](const std::shared_ptr<shm::Arena>& arena,
                         absl::Status s) {
        e->OnPrefaulted(arena, std::move(s));
      });
  CKPT_RETURN_IF_ERROR(engine->Recover());  // queues what is not yet durable
  engine->pipeline_->Start();
  engine->metrics_->SetSnapshotSource(
      [e = engine.get()] { return e->Snapshot(); });
  engine->reaper_ = std::thread([e = engine.get()] { e->ReapLoop(); });
  return engine;
}

Engine::~Engine() {
  metrics_->SetSnapshotSource(nullptr);  // waits for a scrape in progress
  prefaulter_.reset();                   // its callback takes mu_
  if (pipeline_) pipeline_->Stop();      // its tasks take mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  writer_.reset();  // writes what is queued
  for (auto& [name, job] : jobs_)
    for (auto& [r, rank] : job.ranks)
      if (rank.arena && rank.registered)
        backend_->UnregisterMemory(rank.arena->slot_data(0));
}

absl::StatusOr<Engine::Job*> Engine::FindJobLocked(const std::string& job,
                                                   const PeerCreds& peer) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job));
  auto it = jobs_.find(job);
  if (it == jobs_.end())
    return absl::NotFoundError(absl::StrCat("job: unknown job '", job, "'"));
  if (peer.uid != 0 && peer.uid != it->second.rec.uid())
    return absl::PermissionDeniedError(
        absl::StrCat("job '", job, "' belongs to uid ", it->second.rec.uid(),
                     ", caller is uid ", peer.uid));
  return &it->second;
}

Shard* Engine::FindShardLocked(const std::string& job, uint64_t step,
                               uint32_t rank) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto st = j->second.steps.find(step);
  if (st == j->second.steps.end()) return nullptr;
  auto sh = st->second.shards.find(rank);
  return sh == st->second.shards.end() ? nullptr : &sh->second;
}

absl::StatusOr<Engine::Rank*> Engine::FindRankLocked(Job& job, uint32_t rank) {
  if (rank >= job.rec.world_size())
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", rank, " is not below world_size ", job.rec.world_size()));
  auto it = job.ranks.find(rank);
  if (it == job.ranks.end() || !it->second.arena)
    return absl::FailedPreconditionError(
        absl::StrCat("rank: rank ", rank, " of job '", job.rec.job(),
                     "' is not registered"));
  return &it->second;
}

void Engine::EraseIfUnrecordedLocked(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end() || it->second.recorded) return;
  for (const auto& [r, rank] : it->second.ranks)
    if (rank.arena || rank.creating) return;
  jobs_.erase(it);
}

void Engine::MaybeForgetJobLocked(const std::string& name) {
  auto it = jobs_.find(name);
  if (it == jobs_.end() || !it->second.forget_when_idle) return;
  Job& job = it->second;
  if (!job.steps.empty()) return;
  if (leases_.AnyForJob(name)) return;
  for (const auto& [r, rank] : job.ranks) {
    if (rank.creating) return;
    for (const Slot& s : rank.slots)
      if (s.state != shm::SlotState::kFree)
        return;  // being persisted or loaded
  }
  std::vector<uint32_t> ranks;
  for (const auto& [r, rank] : job.ranks) ranks.push_back(r);
  for (uint32_t r : ranks) DropArenaLocked(job, r, /*unlink=*/true);
  CatalogEdit edit;
  edit.DeleteJob(name);
  RecordLocked(std::move(edit), /*sync=*/true);
  LogInfo(absl::StrCat("job ", name,
                       ": every step deleted; record and arenas removed"));
  jobs_.erase(it);
  metrics_->ForgetJob(name);
  slot_cv_.notify_all();
  durable_cv_.notify_all();
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

  std::unique_lock<std::mutex> lock(mu_);
  if (draining_) return absl::UnavailableError("ckptd is shutting down");
  auto it = jobs_.find(req.job());
  if (it == jobs_.end()) {
    // Recorded in the catalog only once its first arena exists.
    Job job;
    job.rec.set_job(req.job());
    job.rec.set_world_size(req.world_size());
    job.rec.set_uid(peer.uid);
    job.rec.set_num_slots(num_slots);
    job.rec.set_slot_bytes(0);
    job.recorded = false;
    it = jobs_.emplace(req.job(), std::move(job)).first;
  }
  Job& job = it->second;
  if (peer.uid != job.rec.uid())
    return absl::PermissionDeniedError(
        absl::StrCat("job '", req.job(), "' belongs to uid ", job.rec.uid(),
                     ", caller is uid ", peer.uid));
  if (req.world_size() != job.rec.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", req.world_size(),
                     " differs from the job's ", job.rec.world_size()));
  job.forget_when_idle = false;
  auto ensured = EnsureArena(lock, req.job(), req.rank(), req.slot_bytes());
  if (!ensured.ok()) {
    EraseIfUnrecordedLocked(req.job());
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

void Engine::ReleaseLeaseLocked(uint64_t id) {
  std::optional<Lease> removed = leases_.Remove(id);
  if (!removed) return;
  const Lease& lease = *removed;
  if (!lease.file_key.empty()) {
    // A FILE restore is over: the deletes it held back go now.
    std::vector<LocalDelete> deferred;
    deferred.swap(deferred_deletes_);
    for (LocalDelete& d : deferred) PushLocalDeleteLocked(std::move(d));
    MaybeForgetJobLocked(lease.job);
    return;
  }
  auto job = jobs_.find(lease.job);
  if (job == jobs_.end()) return;
  auto rank = job->second.ranks.find(lease.rank);
  if (rank == job->second.ranks.end() || !rank->second.arena ||
      lease.slot >= rank->second.slots.size())
    return;
  if (lease.write)
    rank->second.EndWrite(lease.slot, id);
  else
    rank->second.EndRead(lease.slot);
  MaybeForgetJobLocked(lease.job);
  slot_cv_.notify_all();
}

absl::StatusOr<v1::BeginSaveResponse> Engine::BeginSave(
    const PeerCreds& peer, const v1::BeginSaveRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (draining_)
    return absl::UnavailableError("ckptd is shutting down: no new saves");
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  CKPT_ASSIGN_OR_RETURN(Rank * rank, FindRankLocked(*job, req.rank()));
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
    CKPT_ASSIGN_OR_RETURN(rank, FindRankLocked(*job, req.rank()));
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
    if (slot_cv_.wait_until(lock, start + timeout) == std::cv_status::timeout)
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no free slot for job '", req.job(), "' rank ",
                       req.rank(), " after waiting ", timeout.count(), " ms"));
    if (draining_)
      return absl::UnavailableError("ckptd is shutting down: no new saves");
    CKPT_ASSIGN_OR_RETURN(job, FindJobLocked(req.job(), peer));
  }
  Slot& s = rank->slots[slot];
  if (s.state == shm::SlotState::kDurable || s.reclaimable) {
    // The shard it held stays restorable from disk (if it is durable).
    for (auto& [n, step] : job->steps) {
      auto sh = step.shards.find(req.rank());
      if (sh == step.shards.end() || sh->second.slot != slot) continue;
      Shard& lost = sh->second;
      lost.slot = -1;
      if (lost.phase != ShardPhase::kStaged) continue;
      // Its persist kept failing, and now its bytes are gone.
      metrics_->Failure(metric::kPersistAbandoned);
      FailShardLocked(lost, absl::StrCat("its slot went to step ", req.step(),
                                         " while its persist kept failing: ",
                                         lost.rec.error()));
      LogWarning(absl::StrCat("job ", req.job(), " step ", n, " rank ",
                              req.rank(), ": ", lost.rec.error()));
    }
  }
  Lease lease{req.job(),  req.rank(), static_cast<uint32_t>(slot),
              req.step(), true,       peer.pid};
  lease.begun = arrived;
  lease.granted = std::chrono::steady_clock::now();
  CKPT_ASSIGN_OR_RETURN(uint64_t id, leases_.Add(std::move(lease)));
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
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  (void)job;
  if (leases_.FindFor(req.lease(), req.job(), req.rank(), /*write=*/true) ==
      nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no save ", req.lease(),
                                            " of job '", req.job(), "' rank ",
                                            req.rank()));
  if (committing_.count(req.lease()))
    return absl::FailedPreconditionError(absl::StrCat(
        "lease: save ", req.lease(), " is being committed; too late to abort"));
  ReleaseLeaseLocked(req.lease());
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
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lock, std::chrono::milliseconds(100));
    for (uint64_t id : leases_.DeadHolders()) ReleaseLeaseLocked(id);
    reaper_ticks_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace ckpt::daemon
