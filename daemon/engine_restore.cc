// Latest, restore, list, delete and status. See engine.h.
#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "storage/shard_format.h"
#include "storage/shard_image.h"
#include "util/status.h"

namespace ckpt::daemon {

absl::StatusOr<v1::LatestResponse> Engine::Latest(
    const PeerCreds& peer, const v1::LatestRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  v1::LatestResponse resp;
  for (auto it = job->steps.rbegin(); it != job->steps.rend(); ++it) {
    bool durable = false;
    if (!StepCompleteLocked(*job, it->second, &durable)) continue;
    resp.set_found(true);
    resp.set_step(it->first);
    if (ObjectCommit()) durable = durable && it->second.object_manifest;
    resp.set_durable(durable);
    break;
  }
  return resp;
}

absl::StatusOr<v1::OpenRestoreResponse> Engine::OpenRestore(
    const PeerCreds& peer, const v1::OpenRestoreRequest& req) {
  const auto arrived = std::chrono::steady_clock::now();
  auto count = [&](std::string_view source, uint64_t bytes) {
    metrics_->Restored(source,
                       std::chrono::duration<double>(
                           std::chrono::steady_clock::now() - arrived)
                           .count(),
                       bytes);
  };
  std::unique_lock<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  if (req.rank() >= job->rec.world_size())
    return absl::InvalidArgumentError(absl::StrCat("rank: ", req.rank(),
                                                   " is not below world_size ",
                                                   job->rec.world_size()));
  auto not_found = [&] {
    return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                            "' has no step ", req.step(),
                                            " for rank ", req.rank()));
  };
  Shard* shard = FindShardLocked(req.job(), req.step(), req.rank());
  if (shard == nullptr) return not_found();
  v1::OpenRestoreResponse resp;
  resp.set_source(v1::RESTORE_SOURCE_MEMORY);
  std::optional<std::string> path;
  if (shard->slot < 0 && shard->phase == ShardPhase::kDurable &&
      !shard->local_gone && req.allow_file_read())
    path = ClientReadablePath(peer, *shard);
  if (path) {
    // The client reads the file into its own buffers: one read, no arena.
    LogInfo(absl::StrCat("restore job ", req.job(), " step ", req.step(),
                         " rank ", req.rank(), ": the client reads ",
                         shard->rec.path()));
    // The lease keeps the file: a delete (retention, a re-save, Delete)
    // waits until the client's CloseRestore or its exit.
    Lease lease{req.job(), req.rank(), 0, req.step(), false, peer.pid};
    lease.file_key = shard->rec.path();
    CKPT_ASSIGN_OR_RETURN(uint64_t lease_id, leases_.Add(std::move(lease)));
    resp.set_lease(lease_id);
    resp.set_source(v1::RESTORE_SOURCE_FILE);
    resp.set_path(*path);
    resp.set_image_bytes(shard->rec.image_bytes());
    *resp.mutable_tensors() = shard->rec.tensors();
    count(metric::kSourceDisk, shard->rec.image_bytes());
    return resp;
  }
  if (shard->slot < 0) {
    if (shard->phase != ShardPhase::kDurable)
      return absl::DataLossError(absl::StrCat(
          "step ", req.step(), " rank ", req.rank(),
          " is neither in memory nor durable: ", shard->rec.error()));
    double load_s = 0;
    bool from_object = false;
    absl::StatusOr<Shard*> loaded = LoadShardLocked(
        lock, req.job(), req.step(), req.rank(), &load_s, &from_object);
    if (!loaded.ok()) {
      // BUSY and "changed meanwhile" are not failures of the load.
      const absl::StatusCode code = loaded.status().code();
      if (code == absl::StatusCode::kDataLoss)
        metrics_->Failure(metric::kRestoreChecksum);
      else if (code != absl::StatusCode::kResourceExhausted &&
               code != absl::StatusCode::kAborted)
        metrics_->Failure(metric::kRestoreLoad);
      return loaded.status();
    }
    shard = *loaded;
    job = &jobs_.find(req.job())->second;
    resp.set_load_s(load_s);
    resp.set_source(from_object ? v1::RESTORE_SOURCE_OBJECT
                                : v1::RESTORE_SOURCE_DISK);
  }
  Rank& rank = job->ranks[req.rank()];
  Lease lease{req.job(),  req.rank(), static_cast<uint32_t>(shard->slot),
              req.step(), false,      peer.pid};
  CKPT_ASSIGN_OR_RETURN(uint64_t lease_id, leases_.Add(std::move(lease)));
  rank.AddReader(static_cast<uint32_t>(shard->slot));
  resp.set_lease(lease_id);
  resp.set_shm_name(rank.arena->name());
  resp.set_arena_bytes(rank.arena->size());
  resp.set_slot_offset(rank.arena->slot_offset(shard->slot));
  resp.set_image_bytes(shard->rec.image_bytes());
  *resp.mutable_tensors() = shard->rec.tensors();
  count(resp.source() == v1::RESTORE_SOURCE_MEMORY   ? metric::kSourceMemory
        : resp.source() == v1::RESTORE_SOURCE_OBJECT ? metric::kSourceObject
                                                     : metric::kSourceDisk,
        shard->rec.image_bytes());
  return resp;
}

namespace {

// Whether the caller's uid/gid may open path for reading, directories on
// the way included. A root daemon asks the kernel with the caller's
// filesystem ids (setfsuid/setfsgid change only this thread, and drop its
// CAP_DAC_* while they are not 0); a daemon that is not root cannot take
// another uid's ids and relies on the owner and mode checks alone.
bool CallerCanOpen(const PeerCreds& peer, const std::string& path) {
  if (geteuid() != 0 || peer.uid == 0) return true;
  const int old_gid = setfsgid(peer.gid);
  const int old_uid = setfsuid(peer.uid);
  const bool readable =
      faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS) == 0;
  setfsuid(old_uid);
  setfsgid(old_gid);
  return readable;
}

}  // namespace

std::optional<std::string> Engine::ClientReadablePath(const PeerCreds& peer,
                                                      const Shard& shard) {
  std::optional<std::string> path = backend_->LocalPath(shard.rec.path());
  if (!path) return std::nullopt;  // no local file: the daemon loads it
  auto object = backend_->Stat(shard.rec.path());
  if (!object.ok() || object->size != shard.rec.image_bytes())
    return std::nullopt;
  // The caller opens the file with its own credentials: it must be root or
  // the file's owner (the persister creates it owned by the job's uid), and
  // the owner's read bit must be set. Root is held to the bit too: a trainer
  // need not have CAP_DAC_OVERRIDE, and a wrong guess costs a failed restore
  // where a slot load costs one copy.
  if (!object->owner_uid || !object->mode) return std::nullopt;
  if (peer.uid != 0 && *object->owner_uid != peer.uid) return std::nullopt;
  if ((*object->mode & S_IRUSR) == 0) return std::nullopt;
  if (!CallerCanOpen(peer, *path)) return std::nullopt;
  return path;
}

absl::StatusOr<Shard*> Engine::LoadShardLocked(
    std::unique_lock<std::mutex>& lock, const std::string& job_name,
    uint64_t step_no, uint32_t rank_no, double* load_s, bool* from_object) {
  Shard* shard = FindShardLocked(job_name, step_no, rank_no);
  const uint64_t gen = shard->gen;
  const uint64_t bytes = shard->rec.image_bytes();
  const std::string key = shard->rec.path();
  const bool local = !shard->local_gone;
  const bool object = object_ != nullptr && shard->uploaded;
  const storage::ShardInfo info = shard->info;
  bool read_object = false;
  auto changed = [] {
    return absl::AbortedError("load: the step changed meanwhile; retry");
  };
  // Load the shard file into a slot: one read, then the client copies.
  auto deadline =
      std::chrono::steady_clock::now() + options_.default_busy_timeout;
  Rank* rank = nullptr;
  int slot = -1;
  for (;;) {
    // The lock is released while an arena is created and while waiting for
    // a slot: the job, the rank and the shard are found again each time.
    auto j = jobs_.find(job_name);
    if (j == jobs_.end()) return changed();
    Job* job = &j->second;
    shard = FindShardLocked(job_name, step_no, rank_no);
    if (shard == nullptr || shard->gen != gen) return changed();
    if (shard->slot >= 0) return shard;  // another request loaded it
    auto existing = job->ranks.find(rank_no);
    if (existing == job->ranks.end() || !existing->second.arena ||
        existing->second.creating ||
        existing->second.arena->slot_bytes() < bytes) {
      uint64_t need = std::max<uint64_t>(bytes, job->rec.slot_bytes());
      CKPT_RETURN_IF_ERROR(EnsureArena(lock, job_name, rank_no, need).status());
      continue;
    }
    rank = &existing->second;
    slot = rank->PickSlot();
    if (slot >= 0) break;
    if (!rank->reserve_error.ok())
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no usable slot to load the shard into: ",
                       rank->reserve_error.message()));
    if (slot_cv_.wait_until(lock, deadline) == std::cv_status::timeout)
      return absl::ResourceExhaustedError(
          "BUSY: no slot to load the shard into");
  }
  Job* job = &jobs_.find(job_name)->second;
  for (auto& [n, st] : job->steps) {
    auto o = st.shards.find(rank_no);
    if (o != st.shards.end() && o->second.slot == slot) o->second.slot = -1;
  }
  rank->BeginWrite(slot, step_no, bytes, /*lease=*/0, /*writer_pid=*/0);
  char* dst = rank->arena->slot_data(slot);
  lock.unlock();
  auto t0 = std::chrono::steady_clock::now();
  absl::Status st =
      ReadShardImage(key, local, object, info, dst, bytes, &read_object);
  if (st.ok())
    st = storage::ValidateImage({dst, bytes}, {job_name, step_no, rank_no}, key)
             .status();
  *load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
  if (from_object != nullptr) *from_object = read_object;
  LogInfo(absl::StrCat("load ", key, read_object ? " (object tier)" : "",
                       ": read ", bytes, " bytes in ", *load_s, " s",
                       st.ok() ? "" : ": ", st.message()));
  lock.lock();
  // The job, rank or shard may have changed while the lock was released
  // (a slot in state kWriting is never replaced, so the arena is the same).
  auto j = jobs_.find(job_name);
  Rank* r = nullptr;
  if (j != jobs_.end() && j->second.ranks.count(rank_no))
    r = &j->second.ranks[rank_no];
  bool slot_ok = r && r->arena && r->arena->slot_data(slot) == dst;
  if (slot_ok) {
    r->Free(slot);
  }
  slot_cv_.notify_all();
  Shard* cur = FindShardLocked(job_name, step_no, rank_no);
  if (!st.ok() || !slot_ok || !cur || cur->gen != gen) {
    MaybeForgetJobLocked(job_name);
    if (!st.ok()) return Annotate(st, "load from storage");
    return changed();
  }
  r->Hold(slot, SlotStateOf(cur->phase), step_no, gen, bytes);
  cur->slot = slot;
  cur->slot_from_storage = true;
  return cur;
}

absl::Status Engine::CloseRestore(const PeerCreds& peer,
                                  const v1::CloseRestoreRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  if (req.bad_copy().size() > 4096)
    return absl::InvalidArgumentError(absl::StrCat(
        "bad_copy: ", req.bad_copy().size(), " bytes, at most 4096"));
  if (req.lease() == 0 && !req.bad_copy().empty()) {
    // A FILE restore: the shard's stored copy is bad.
    Shard* shard = FindShardLocked(req.job(), req.step(), req.rank());
    if (shard == nullptr)
      return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                              "' has no step ", req.step(),
                                              " for rank ", req.rank()));
    if (shard->phase == ShardPhase::kDurable && !shard->local_gone)
      MarkBadCopyLocked(*job, *shard, /*stored=*/true, req.bad_copy());
    lock.unlock();
    writer_->Flush();  // a failed shard's record, written before we answer
    return absl::OkStatus();
  }
  const Lease* lease =
      leases_.FindFor(req.lease(), req.job(), req.rank(), /*write=*/false);
  if (lease == nullptr)
    return absl::NotFoundError(absl::StrCat("lease: no open restore ",
                                            req.lease(), " of job '", req.job(),
                                            "' rank ", req.rank()));
  if (!req.bad_copy().empty()) {
    Shard* shard = FindShardLocked(req.job(), lease->step, req.rank());
    if (shard != nullptr && !lease->file_key.empty()) {
      // A FILE restore: the stored copy it read is bad (if still that one).
      if (shard->phase == ShardPhase::kDurable && !shard->local_gone &&
          shard->rec.path() == lease->file_key)
        MarkBadCopyLocked(*job, *shard, /*stored=*/true, req.bad_copy());
    } else if (shard != nullptr &&
               shard->slot == static_cast<int>(lease->slot)) {
      MarkBadCopyLocked(*job, *shard, shard->slot_from_storage, req.bad_copy());
    }
  }
  ReleaseLeaseLocked(req.lease());
  if (req.bad_copy().empty()) return absl::OkStatus();
  lock.unlock();
  writer_->Flush();  // a failed shard's record, written before we answer
  return absl::OkStatus();
}

void Engine::MarkBadCopyLocked(Job& job, Shard& shard, bool stored,
                               const std::string& error) {
  const std::string what =
      absl::StrCat("job ", job.rec.job(), " step ", shard.rec.step(), " rank ",
                   shard.rec.rank());
  metrics_->Failure(metric::kRestoreChecksum);
  if (shard.slot >= 0) {
    // The slot's image goes (its last reader frees the slot).
    auto rank = job.ranks.find(shard.rec.rank());
    if (rank != job.ranks.end()) rank->second.DropShard(shard.slot, shard.gen);
    shard.slot = -1;
    shard.slot_from_storage = false;
  }
  FallbackReport fallback;
  fallback.job = job.rec.job();
  fallback.step = shard.rec.step();
  fallback.rank = shard.rec.rank();
  fallback.copy = stored ? "file" : "memory";
  fallback.reason = absl::StrCat("failed verification: ", error);
  if (!stored && shard.phase == ShardPhase::kDurable) {
    LogWarning(absl::StrCat("FALLBACK: ", what,
                            ": the copy in memory failed verification (", error,
                            "); restores read ", shard.rec.path(), " next"));
    fallback.next_copy = "file";
    if (options_.on_fallback) options_.on_fallback(fallback);
    return;
  }
  if (options_.on_fallback) options_.on_fallback(fallback);
  // No good copy left: the step is no longer restorable here, and Latest
  // offers the previous good step.
  LogWarning(absl::StrCat(
      "FALLBACK: ", what, ": ",
      stored ? "the stored copy " + shard.rec.path() : "the copy in memory",
      " failed verification (", error,
      "); no other copy here, the step is dropped from Latest"));
  FailShardLocked(shard, absl::StrCat("failed verification: ", error));
  auto step = job.steps.find(shard.rec.step());
  if (step != job.steps.end() && step->second.manifest) {
    // The step is not whole any more: its manifest must not count.
    persister_->QueueDelete(NodeManifestKey(job.rec.job(), shard.rec.step()),
                            false);
    step->second.manifest = false;
  }
}

absl::Status Engine::WaitDurable(const PeerCreds& peer,
                                 const v1::WaitDurableRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(req.timeout_ms() ? req.timeout_ms() : 600000);
  for (;;) {
    CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
    (void)job;
    const Shard* found = FindShardLocked(req.job(), req.step(), req.rank());
    if (found == nullptr)
      return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                              "' has no step ", req.step(),
                                              " for rank ", req.rank()));
    const Shard& shard = *found;
    if (CommitDurable(shard)) {
      // As durable in the catalog as on storage: the record of it (queued
      // with the change, written outside mu_) is written when we answer.
      lock.unlock();
      writer_->Flush();
      return absl::OkStatus();
    }
    if (shard.phase == ShardPhase::kFailed)
      return absl::DataLossError(absl::StrCat("persist of step ", req.step(),
                                              " rank ", req.rank(),
                                              " failed: ", shard.rec.error()));
    if (durable_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      const Shard* now = FindShardLocked(req.job(), req.step(), req.rank());
      if (now != nullptr && now->phase == ShardPhase::kStaged &&
          now->attempts >= options_.max_persist_attempts)
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
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListResponse resp;
  if (!req.job().empty()) {
    // A job whose steps were all deleted has no record left: listed empty.
    absl::Status found = FindJobLocked(req.job(), peer).status();
    if (absl::IsNotFound(found)) return resp;
    CKPT_RETURN_IF_ERROR(found);
  }
  for (const auto& [name, job] : jobs_) {
    if (!req.job().empty() && name != req.job()) continue;
    if (peer.uid != 0 && peer.uid != job.rec.uid()) continue;
    if (!job.recorded) continue;  // a first Register is still creating it
    v1::JobInfo* ji = resp.add_jobs();
    ji->set_job(name);
    ji->set_world_size(job.rec.world_size());
    ji->set_uid(job.rec.uid());
    for (const auto& [n, step] : job.steps) {
      v1::StepInfo* si = ji->add_steps();
      si->set_step(n);
      bool durable = false;
      si->set_complete(StepCompleteLocked(job, step, &durable));
      si->set_durable(durable &&
                      (ObjectCommit() ? step.object_manifest
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

absl::StatusOr<v1::DeleteResponse> Engine::Delete(
    const PeerCreds& peer, const v1::DeleteRequest& req) {
  std::unique_lock<std::mutex> lock(mu_);
  CKPT_ASSIGN_OR_RETURN(Job * job, FindJobLocked(req.job(), peer));
  std::vector<uint64_t> steps;
  if (req.all_steps()) {
    for (const auto& [n, step] : job->steps) steps.push_back(n);
  } else {
    if (!job->steps.count(req.step()))
      return absl::NotFoundError(
          absl::StrCat("step: job '", req.job(), "' has no step ", req.step()));
    steps.push_back(req.step());
  }
  for (uint64_t n : steps) {
    if (object_ != nullptr) QueueObjectDeleteLocked(*job, n);
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job->steps[n].shards) ranks.push_back(r);
    // The files go through the persister's queue (recorded as intents,
    // held back while a FILE restore reads one), never under the lock.
    for (uint32_t r : ranks) DropShardLocked(*job, n, r, /*delete_file=*/true);
  }
  if (req.all_steps()) {
    // Nothing left: the job's record and arenas go once nothing uses them;
    // a later Register creates the job again.
    job->forget_when_idle = true;
    MaybeForgetJobLocked(req.job());
  }
  v1::DeleteResponse resp;
  resp.set_deleted_steps(static_cast<uint32_t>(steps.size()));
  // Deleted once the RPC answers: its records are written (outside mu_).
  lock.unlock();
  writer_->Flush();
  return resp;
}

v1::StatusResponse Engine::Status(const PeerCreds& peer) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::StatusResponse resp;
  resp.set_uptime_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_)
          .count());
  resp.set_backend(backend_->name());
  uint64_t in_flight = 0;
  for (const auto& [name, job] : jobs_) {
    // Other uids' jobs are not shown (as in List); the counters are global.
    if (peer.uid != 0 && peer.uid != job.rec.uid()) continue;
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.arena) continue;
      v1::ArenaStatus* a = resp.add_arenas();
      a->set_job(name);
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
    for (const auto& [n, step] : job.steps)
      for (const auto& [r, shard] : step.shards)
        if (shard.phase == ShardPhase::kStaged ||
            shard.phase == ShardPhase::kPersisting)
          in_flight += shard.rec.image_bytes();
  }
  resp.set_bytes_in_flight(in_flight);
  resp.set_persist_queue(static_cast<uint32_t>(persister_->Size()));
  resp.set_persisted_shards(persisted_shards_);
  resp.set_persisted_bytes(persisted_bytes_);
  resp.set_failed_persists(failed_persists_);
  if (std::optional<UploadBacklog> b = ObjectBacklog()) {
    resp.set_object_tier(object_->name());
    resp.set_commit_tier(ObjectCommit() ? "object" : "local");
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
