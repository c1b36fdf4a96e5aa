// Restore: which step (Latest), where its bytes come from (OpenRestore's
// one decision: memory, the caller reading the file, or a load into a slot
// from the local or object tier) and the load itself. The fallback when a
// copy fails verification is in engine_fallback.cc. See engine.h.
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
namespace {

// "; newest is N" (the job's newest step complete on every rank), for an
// error about a step the job does not have.
std::string NewestCompleteNote(const JobTable& table, const Job& job)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu()) {
  bool durable = false;
  for (auto it = job.steps.rbegin(); it != job.steps.rend(); ++it)
    if (table.StepComplete(job, it->second, &durable))
      return absl::StrCat("; newest is ", it->first);
  return "; the job has no complete step here";
}

}  // namespace

absl::StatusOr<v1::LatestResponse> Engine::Latest(
    const PeerCreds& peer, const v1::LatestRequest& req) {
  Section lock(this);
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
  v1::LatestResponse resp;
  for (auto it = job->steps.rbegin(); it != job->steps.rend(); ++it) {
    bool durable = false;
    if (!table_.StepComplete(*job, it->second, &durable)) continue;
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
  Section lock(this);
  // A replacement's trainer may start while its shard still arrives.
  CKPT_RETURN_IF_ERROR(WaitFetch(req.job(), req.step(), req.rank()));
  auto bad_rank = [&](const Job& j) -> absl::Status {
    if (req.rank() < j.rec.world_size()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", req.rank(), " is not below world_size ", j.rec.world_size()));
  };
  CKPT_ASSIGN_OR_RETURN(Job * job, table_.FindFor(req.job(), peer));
  CKPT_RETURN_IF_ERROR(bad_rank(*job));
  // The missing step first, then what there is instead.
  auto not_found = [&](const std::string& newest) {
    return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                            "' has no step ", req.step(),
                                            " for rank ", req.rank(), newest));
  };
  Shard* shard = table_.FindShard(req.job(), req.step(), req.rank());
  if (shard == nullptr) return not_found(NewestCompleteNote(table_, *job));
  // A restore that opens lets this process go on from the step (BeginSave).
  auto restored = [&](Job& j) {
    j.restored_by[req.rank()] = Job::Restorer{peer.pid, req.step()};
  };
  v1::OpenRestoreResponse resp;
  resp.set_source(v1::RESTORE_SOURCE_MEMORY);
  auto copy_of = [&](const Shard& s) {
    return RestoreCopyOf(s, req.allow_file_read());
  };
  std::optional<std::string> path;
  if (copy_of(*shard) == RestoreCopy::kFileIfReadable) {
    // The file is checked (a stat and an access check, which on a shared
    // root wait for its server) with the lock released; the shard is
    // found again after, and a path checked for another generation of it
    // is not used.
    const uint64_t gen = shard->gen;
    const std::string key = shard->rec.path();
    const uint64_t image_bytes = shard->rec.image_bytes();
    lock.Unlock();
    path = ClientReadablePath(peer, key, image_bytes);
    lock.Relock();
    CKPT_ASSIGN_OR_RETURN(job, table_.FindFor(req.job(), peer));
    CKPT_RETURN_IF_ERROR(bad_rank(*job));
    shard = table_.FindShard(req.job(), req.step(), req.rank());
    if (shard == nullptr) return not_found(NewestCompleteNote(table_, *job));
    if (shard->gen != gen || copy_of(*shard) != RestoreCopy::kFileIfReadable)
      path.reset();
  }
  if (path) {
    // The client reads the file into its own buffers: one read, no arena.
    LogInfo(absl::StrCat("restore job ", req.job(), " step ", req.step(),
                         " rank ", req.rank(), ": the client reads ",
                         shard->rec.path()));
    // The lease keeps the file: a delete (retention, a re-save, Delete)
    // waits until the client's CloseRestore or its exit.
    Lease lease{req.job(), req.rank(), 0, req.step(), false, peer.pid};
    lease.file_key = shard->rec.path();
    CKPT_ASSIGN_OR_RETURN(uint64_t lease_id,
                          table_.leases().Add(std::move(lease)));
    resp.set_lease(lease_id);
    resp.set_source(v1::RESTORE_SOURCE_FILE);
    resp.set_path(*path);
    resp.set_image_bytes(shard->rec.image_bytes());
    *resp.mutable_tensors() = shard->rec.tensors();
    count(metric::kSourceDisk, shard->rec.image_bytes());
    restored(*job);
    return resp;
  }
  const RestoreCopy copy = copy_of(*shard);
  if (copy == RestoreCopy::kLost)
    return absl::DataLossError(absl::StrCat(
        "step ", req.step(), " rank ", req.rank(),
        " is neither in memory nor durable: ", shard->rec.error()));
  if (copy != RestoreCopy::kSlot) {  // a load (or a file it may not read)
    double load_s = 0;
    bool from_object = false;
    absl::StatusOr<Shard*> loaded =
        LoadShard(req.job(), req.step(), req.rank(), &load_s, &from_object);
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
    job = table_.Find(req.job());
    resp.set_load_s(load_s);
    resp.set_source(from_object ? v1::RESTORE_SOURCE_OBJECT
                                : v1::RESTORE_SOURCE_DISK);
  }
  Rank& rank = job->ranks[req.rank()];
  Lease lease{req.job(),  req.rank(), static_cast<uint32_t>(shard->slot),
              req.step(), false,      peer.pid};
  CKPT_ASSIGN_OR_RETURN(uint64_t lease_id,
                        table_.leases().Add(std::move(lease)));
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
  restored(*job);
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
                                                      const std::string& key,
                                                      uint64_t image_bytes) {
  std::optional<std::string> path = backend_->LocalPath(key);
  if (!path) return std::nullopt;  // no local file: the daemon loads it
  auto object = backend_->Stat(key);
  if (!object.ok() || object->size != image_bytes) return std::nullopt;
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

absl::StatusOr<Shard*> Engine::LoadShard(const std::string& job_name,
                                         uint64_t step_no, uint32_t rank_no,
                                         double* load_s, bool* from_object) {
  Shard* shard = table_.FindShard(job_name, step_no, rank_no);
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
    Job* j = table_.Find(job_name);
    if (j == nullptr) return changed();
    Job* job = j;
    shard = table_.FindShard(job_name, step_no, rank_no);
    if (shard == nullptr || shard->gen != gen) return changed();
    if (shard->slot >= 0) return shard;  // another request loaded it
    auto existing = job->ranks.find(rank_no);
    if (existing == job->ranks.end() || !existing->second.arena ||
        existing->second.creating ||
        existing->second.arena->slot_bytes() < bytes) {
      uint64_t need = std::max<uint64_t>(bytes, job->rec.slot_bytes());
      CKPT_RETURN_IF_ERROR(EnsureArena(job_name, rank_no, need).status());
      continue;
    }
    rank = &existing->second;
    slot = rank->PickSlot();
    if (slot >= 0) break;
    if (!rank->reserve_error.ok())
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no usable slot to load the shard into: ",
                       rank->reserve_error.message()));
    if (!table_.WaitUntil(JobTable::Waiter::kSlot, deadline))
      return absl::ResourceExhaustedError(
          "BUSY: no slot to load the shard into");
  }
  JobTable::DetachSlot(*table_.Find(job_name), rank_no, slot);
  rank->BeginWrite(slot, step_no, bytes, /*lease=*/0, /*writer_pid=*/0);
  char* dst = rank->arena->slot_data(slot);
  const std::shared_ptr<shm::Arena> arena = rank->arena;
  table_.Unlock();
  auto t0 = std::chrono::steady_clock::now();
  absl::Status st =
      ReadShardImage(key, local, object, info, dst, bytes, &read_object);
  if (st.ok())
    st = storage::ValidateImage({dst, bytes}, {job_name, step_no, rank_no}, key)
             .status();
  // The job's uid may have truncated the arena under the load.
  if (absl::Status a = arena->CheckIntact(); !a.ok()) st = a;
  *load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
  if (from_object != nullptr) *from_object = read_object;
  LogInfo(absl::StrCat("load ", key, read_object ? " (object tier)" : "",
                       ": read ", bytes, " bytes in ", *load_s, " s",
                       st.ok() ? "" : ": ", st.message()));
  table_.Relock();
  // The job, rank or shard may have changed while the lock was released
  // (a slot in state kWriting is never replaced, so the arena is the same).
  Job* j = table_.Find(job_name);
  Rank* r = nullptr;
  if (j != nullptr && j->ranks.count(rank_no)) r = &j->ranks[rank_no];
  bool slot_ok = r && r->arena && r->arena->slot_data(slot) == dst;
  if (slot_ok) {
    r->Free(slot);
  }
  table_.Wake(JobTable::Waiter::kSlot);
  Shard* cur = table_.FindShard(job_name, step_no, rank_no);
  if (!st.ok() || !slot_ok || !cur || cur->gen != gen) {
    MaybeForgetJob(job_name);
    if (!st.ok()) return Annotate(st, "load from storage");
    return changed();
  }
  r->Hold(slot, SlotStateOf(cur->phase), step_no, gen, bytes);
  cur->slot = slot;
  cur->slot_copy = read_object ? ShardCopy::kObject : ShardCopy::kFile;
  return cur;
}

}  // namespace ckpt::daemon
