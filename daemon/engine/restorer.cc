// Restore: which step (Latest), where its bytes come from (OpenRestore's
// one decision: memory, the caller reading the file, or a load into a slot
// from the local or object tier) and the load itself. The fallback when a
// copy fails verification is in restorer_fallback.cc, the loads in
// restorer_load.cc. See restorer.h.
#include "daemon/engine/restorer.h"

#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <span>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/replica/ranged_read.h"
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

absl::Status Restorer::WaitFetch(const std::string& job, uint64_t step,
                                 uint32_t rank) {
  const auto deadline =
      std::chrono::steady_clock::now() + node_.options.default_busy_timeout;
  while (node_.table.Fetching(job, step, rank)) {
    if (!node_.table.WaitUntil(JobTable::Waiter::kFetch, deadline))
      return absl::DeadlineExceededError(
          absl::StrCat("step: the fetch of job '", job, "' step ", step,
                       " rank ", rank, " is still running"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::LatestResponse> Restorer::Latest(
    const PeerCreds& peer, const v1::LatestRequest& req) {
  Section lock(&node_);
  CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
  v1::LatestResponse resp;
  for (auto it = job->steps.rbegin(); it != job->steps.rend(); ++it) {
    bool durable = false;
    if (!node_.table.StepComplete(*job, it->second, &durable)) continue;
    resp.set_found(true);
    resp.set_step(it->first);
    if (node_.ObjectCommit()) durable = durable && it->second.object_manifest;
    resp.set_durable(durable);
    break;
  }
  return resp;
}

absl::StatusOr<v1::OpenRestoreResponse> Restorer::OpenRestore(
    const PeerCreds& peer, const v1::OpenRestoreRequest& req,
    LoadProgress* progress) {
  const auto arrived = std::chrono::steady_clock::now();
  auto count = [&](std::string_view source, uint64_t bytes) {
    node_.metrics->Restored(source,
                            std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - arrived)
                                .count(),
                            bytes);
  };
  // The shard read: the caller's rank's, or a saved rank's (a step saved
  // at another world size than the caller's, which it must name).
  const uint32_t shard_rank =
      req.has_saved_rank() ? req.saved_rank() : req.rank();
  Section lock(&node_);
  // A replacement's trainer may start while its shard still arrives.
  CKPT_RETURN_IF_ERROR(WaitFetch(req.job(), req.step(), shard_rank));
  auto bad_rank = [&](const Job& j) -> absl::Status {
    if (req.rank() < j.rec.world_size()) return absl::OkStatus();
    // A resized job's rank may restore before its first registration
    // tells this node the new world size (a client registers at its
    // first save): only the saved rank's shard is read.
    if (req.has_saved_rank() && req.rank() < node_.options.max_world_size)
      return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", req.rank(), " is not below world_size ", j.rec.world_size()));
  };
  // The missing step first, then what there is instead.
  auto not_found = [&](const std::string& newest) {
    return absl::NotFoundError(absl::StrCat("step: job '", req.job(),
                                            "' has no step ", req.step(),
                                            " for rank ", shard_rank, newest));
  };
  absl::StatusOr<Job*> found = node_.table.FindFor(req.job(), peer);
  // Another node's saved rank (a resharded restore reads the ranks it
  // needs wherever they are; a job this node has no shard of at all is
  // one too): from a peer's memory, else loaded from storage, with the
  // lock released.
  absl::Status fetched;
  const bool elsewhere =
      found.ok()
          ? node_.table.FindShard(req.job(), req.step(), shard_rank) == nullptr
          : absl::IsNotFound(found.status());
  // A rank's own shard is fetched from a peer too when this node does not
  // host that rank (a reader of other ranks' shards, such as the DCP
  // reader at another world size on another node); a hosted rank's shard
  // comes with the coordinator's PREFETCH, which the wait above covers.
  const Hosting* hosting = node_.table.HostingOf(req.job());
  const bool hosted =
      hosting != nullptr && hosting->ranks.count(shard_rank) != 0;
  // A slot holding only the chunks the caller's ranges touch (from a
  // peer's memory or from storage), held for this read: answered as
  // `partial`, its tensors with the chunk hashes it was verified with.
  // `gen`: the shard generation it was read from (storage), which must
  // still be the table's.
  // The byte ranges the caller names, checked (inside image_bytes where
  // the image is known here).
  auto asked_ranges = [&](std::optional<uint64_t> image_bytes) {
    return ValidateRanges(std::span<const uint64_t>(req.range_offsets().data(),
                                                    req.range_offsets_size()),
                          std::span<const uint64_t>(req.range_lengths().data(),
                                                    req.range_lengths_size()),
                          image_bytes, "ranges");
  };
  auto answer_partial =
      [&](RangedSlot& got, v1::RestoreSource source,
          std::string_view metric_source, std::optional<uint64_t> gen)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(
              node_.table.mu()) -> absl::StatusOr<v1::OpenRestoreResponse> {
    absl::StatusOr<Job*> j = node_.table.FindFor(req.job(), peer);
    Job* job = j.ok() ? *j : node_.table.Find(req.job());
    Rank* r = nullptr;
    if (job != nullptr)
      if (auto it = job->ranks.find(shard_rank); it != job->ranks.end())
        r = &it->second;
    absl::Status ok = j.status();
    if (ok.ok()) ok = bad_rank(*job);
    if (ok.ok() && (r == nullptr || !r->arena))
      ok = absl::AbortedError("fetch: the rank's arena is gone meanwhile");
    if (ok.ok() && gen) {
      const Shard* now =
          node_.table.FindShard(req.job(), req.step(), shard_rank);
      if (now == nullptr || now->gen != *gen)
        ok = absl::AbortedError("load: the step changed meanwhile; retry");
    }
    absl::StatusOr<uint64_t> lease_id = uint64_t{0};
    if (!ok.ok())
      lease_id = ok;
    else
      lease_id = node_.table.leases().Add(Lease{req.job(), shard_rank,
                                                static_cast<uint32_t>(got.slot),
                                                req.step(), false, peer.pid});
    if (!lease_id.ok()) {
      if (r != nullptr && r->arena &&
          r->EndRead(static_cast<uint32_t>(got.slot)))
        node_.table.Wake(JobTable::Waiter::kSlot);
      return lease_id.status();
    }
    v1::OpenRestoreResponse resp;
    resp.set_source(source);
    resp.set_lease(*lease_id);
    resp.set_shm_name(r->arena->name());
    resp.set_arena_bytes(r->arena->size());
    resp.set_slot_offset(
        r->arena->slot_offset(static_cast<uint32_t>(got.slot)));
    resp.set_image_bytes(got.image_bytes);
    *resp.mutable_tensors() = std::move(got.tensors);
    resp.set_peer_bytes(got.wire_bytes);
    resp.set_partial(true);
    count(metric_source, got.wire_bytes);
    job->restored_by[req.rank()] = Job::Restorer{peer.pid, req.step()};
    return resp;
  };
  if (elsewhere && req.has_saved_rank() && req.range_offsets_size() != 0 &&
      node_.options.fetch_ranges_from_peers) {
    // Only the chunks the caller's ranges touch, from a peer's memory,
    // into a slot held for this read; else (no peer answers them
    // verified) the whole saved rank, below.
    CKPT_ASSIGN_OR_RETURN(std::vector<ImageRange> ranges,
                          asked_ranges(std::nullopt));
    lock.Unlock();
    absl::StatusOr<RangedSlot> got = node_.options.fetch_ranges_from_peers(
        req.job(), req.step(), shard_rank, ranges);
    lock.Relock();
    // Ranges the holders refuse (past the image) are the caller's error.
    if (absl::IsInvalidArgument(got.status())) return got.status();
    if (!got.ok()) {
      LogWarning(absl::StrCat("restore job ", req.job(), " step ", req.step(),
                              " saved rank ", shard_rank,
                              ": ranges from peers: ", got.status().message(),
                              "; the whole saved rank instead"));
    } else {
      return answer_partial(*got, v1::RESTORE_SOURCE_MEMORY,
                            metric::kSourceMemory, std::nullopt);
    }
  }
  // A saved rank no peer serves by ranges and this node's catalog does not
  // record (a lost node's): only the touched chunks, from the key its node
  // manifest names, verified against the chunk hashes that manifest keeps;
  // else (an older manifest, more than a third of the rank, a chunk that
  // does not verify) the whole saved rank, below.
  absl::Status ranged_elsewhere;
  if (elsewhere && req.has_saved_rank() && req.range_offsets_size() != 0) {
    CKPT_ASSIGN_OR_RETURN(std::vector<ImageRange> ranges,
                          asked_ranges(std::nullopt));
    bool from_object = false;
    lock.Unlock();
    absl::StatusOr<RangedSlot> got = RangesFromManifest(
        req.job(), req.step(), shard_rank, ranges, &from_object);
    lock.Relock();
    if (absl::IsInvalidArgument(got.status())) return got.status();
    if (got.ok())
      return answer_partial(
          *got,
          from_object ? v1::RESTORE_SOURCE_OBJECT : v1::RESTORE_SOURCE_DISK,
          from_object ? metric::kSourceObject : metric::kSourceDisk,
          std::nullopt);
    ranged_elsewhere = got.status();
    const std::string why = absl::StrCat(
        "restore job ", req.job(), " step ", req.step(), " saved rank ",
        shard_rank,
        ": ranges from its node manifest's key: ", ranged_elsewhere.message(),
        "; the whole saved rank instead");
    if (absl::IsFailedPrecondition(ranged_elsewhere) ||
        absl::IsNotFound(ranged_elsewhere))
      LogInfo(why);
    else
      LogWarning(why);
  }
  if (elsewhere && req.has_saved_rank()) {
    lock.Unlock();
    fetched = FetchSavedRank(req.job(), req.step(), shard_rank);
    lock.Relock();
    if (!fetched.ok() && absl::IsDataLoss(ranged_elsewhere))
      fetched = Annotate(
          fetched, absl::StrCat("ranges before: ", ranged_elsewhere.message(),
                                "; the whole saved rank"));
    if (!fetched.ok() && !absl::IsNotFound(fetched)) return fetched;
    if (!fetched.ok() && !found.ok()) return fetched;
    found = node_.table.FindFor(req.job(), peer);
  } else if (elsewhere && !hosted && node_.options.fetch_from_peers) {
    lock.Unlock();
    fetched = FetchSavedRankFromPeers(req.job(), req.step(), shard_rank);
    lock.Relock();
    // Whatever the peers said, the shard is not here: NotFound, naming
    // them.
    if (!fetched.ok())
      fetched = absl::NotFoundError(
          absl::StrCat("from peers' memory: ", fetched.message()));
    if (!fetched.ok() && !found.ok())
      return absl::NotFoundError(
          absl::StrCat(found.status().message(), "; ", fetched.message()));
    found = node_.table.FindFor(req.job(), peer);
  }
  CKPT_ASSIGN_OR_RETURN(Job * job, found);
  CKPT_RETURN_IF_ERROR(bad_rank(*job));
  Shard* shard = node_.table.FindShard(req.job(), req.step(), shard_rank);
  if (shard == nullptr && !fetched.ok())
    return absl::NotFoundError(
        absl::StrCat(not_found(NewestCompleteNote(node_.table, *job)).message(),
                     "; ", fetched.message()));
  if (shard == nullptr) return not_found(NewestCompleteNote(node_.table, *job));
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
    CKPT_ASSIGN_OR_RETURN(job, node_.table.FindFor(req.job(), peer));
    CKPT_RETURN_IF_ERROR(bad_rank(*job));
    shard = node_.table.FindShard(req.job(), req.step(), shard_rank);
    if (shard == nullptr)
      return not_found(NewestCompleteNote(node_.table, *job));
    if (shard->gen != gen || copy_of(*shard) != RestoreCopy::kFileIfReadable)
      path.reset();
  }
  if (path) {
    // The client reads the file into its own buffers: one read, no arena.
    LogInfo(absl::StrCat("restore job ", req.job(), " step ", req.step(),
                         " rank ", shard_rank, ": the client reads ",
                         shard->rec.path()));
    // The lease keeps the file: a delete (retention, a re-save, Delete)
    // waits until the client's CloseRestore or its exit.
    Lease lease{req.job(), shard_rank, 0, req.step(), false, peer.pid};
    lease.file_key = shard->rec.path();
    CKPT_ASSIGN_OR_RETURN(uint64_t lease_id,
                          node_.table.leases().Add(std::move(lease)));
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
  Prefaulter::ReadHold load_read;  // from a load's end to the lease's start
  if (copy == RestoreCopy::kLost)
    return absl::DataLossError(absl::StrCat(
        "step ", req.step(), " rank ", shard_rank,
        " is neither in memory nor durable: ", shard->rec.error()));
  if (copy != RestoreCopy::kSlot) {  // a load (or a file it may not read)
    // A saved rank a restore reads part of (its ranges named): only the
    // chunks they touch, by ranged reads, into a slot held for this read;
    // else (a record without chunk hashes, a chunk that does not verify)
    // the whole shard, below.
    absl::Status ranged;
    if (req.has_saved_rank() && req.range_offsets_size() != 0) {
      CKPT_ASSIGN_OR_RETURN(std::vector<ImageRange> ranges,
                            asked_ranges(shard->rec.image_bytes()));
      const uint64_t gen = shard->gen;
      bool from_object = false;
      lock.Unlock();
      absl::StatusOr<RangedSlot> got = RangesFromStorage(
          req.job(), req.step(), shard_rank, ranges, &from_object);
      lock.Relock();
      if (got.ok())
        return answer_partial(
            *got,
            from_object ? v1::RESTORE_SOURCE_OBJECT : v1::RESTORE_SOURCE_DISK,
            from_object ? metric::kSourceObject : metric::kSourceDisk, gen);
      ranged = got.status();
      const std::string why = absl::StrCat(
          "restore job ", req.job(), " step ", req.step(), " saved rank ",
          shard_rank, ": ranges: ", ranged.message(),
          "; the whole shard instead (kept for the next reader)");
      if (absl::IsFailedPrecondition(ranged))
        LogInfo(why);
      else
        LogWarning(why);
      CKPT_ASSIGN_OR_RETURN(job, node_.table.FindFor(req.job(), peer));
      CKPT_RETURN_IF_ERROR(bad_rank(*job));
      shard = node_.table.FindShard(req.job(), req.step(), shard_rank);
      if (shard == nullptr)
        return not_found(NewestCompleteNote(node_.table, *job));
    }
    double load_s = 0;
    bool from_object = false;
    absl::StatusOr<Shard*> loaded =
        LoadShard(req.job(), req.step(), shard_rank, &load_s, &from_object,
                  progress, &load_read);
    if (!loaded.ok() && absl::IsDataLoss(ranged))
      loaded = Annotate(loaded.status(),
                        absl::StrCat("ranges before: ", ranged.message(),
                                     "; the whole shard"));
    if (!loaded.ok()) {
      // BUSY and "changed meanwhile" are not failures of the load.
      const absl::StatusCode code = loaded.status().code();
      if (code == absl::StatusCode::kDataLoss)
        node_.metrics->Failure(metric::kRestoreChecksum);
      else if (code != absl::StatusCode::kResourceExhausted &&
               code != absl::StatusCode::kAborted)
        node_.metrics->Failure(metric::kRestoreLoad);
      return loaded.status();
    }
    shard = *loaded;
    job = node_.table.Find(req.job());
    resp.set_load_s(load_s);
    resp.set_source(from_object ? v1::RESTORE_SOURCE_OBJECT
                                : v1::RESTORE_SOURCE_DISK);
  }
  Rank& rank = job->ranks[shard_rank];
  Lease lease{req.job(),  shard_rank, static_cast<uint32_t>(shard->slot),
              req.step(), false,      peer.pid};
  // The arena's other slots wait while the client copies (prefaulter.h).
  lease.prefault_hold = rank.arena->name();
  CKPT_ASSIGN_OR_RETURN(uint64_t lease_id,
                        node_.table.leases().Add(std::move(lease)));
  if (node_.prefaulter) node_.prefaulter->BeginRead(rank.arena->name());
  load_read.reset();  // the lease holds the prefaulter from here on
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

std::optional<std::string> Restorer::ClientReadablePath(const PeerCreds& peer,
                                                        const std::string& key,
                                                        uint64_t image_bytes) {
  std::optional<std::string> path = node_.backend->LocalPath(key);
  if (!path) return std::nullopt;  // no local file: the daemon loads it
  auto object = node_.backend->Stat(key);
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

}  // namespace ckpt::daemon
