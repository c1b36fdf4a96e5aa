// JobTable: ckptd's in-memory state of its jobs, and the one lock over it.
// Each job has its catalog record, its ranks' arenas and slot tables
// (rank_slots.h) and its steps' shards (step_state.h; each shard's
// lifecycle is shard_phase.h's). Beside the jobs: the leases clients hold
// on slots (lease_table.h), the ranks this node hosts in cluster mode
// (retention.h's Hosting), and the generation counter of saves.
//
// What it offers: the lookups and checks every request starts with (a
// job as the caller may use it, a registered rank, a shard), a first
// Register's job, the shard transitions that keep a shard's slot in step
// with its phase, and the queries over the whole table (completeness with
// the job's hosting, what is not yet durable).
//
// Pure memory: no method does I/O, calls back, or knows the catalog or
// the persistence pipeline. The transitions that need either (Commit,
// Persisted) return it as Effects (effects.h) for the caller to do. Whoever
// changes the state (the Engine) holds the table's lock, queues the catalog
// edit of the change in the same critical section, and does every write and
// storage I/O with it released.
//
// Thread-safety: the lock is private. A caller takes it with a
// JobTable::Lock (scoped, like absl::MutexLock, but it may release and
// take it again); every method that needs it says so
// (ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu())), and clang's -Wthread-safety
// checks each caller (scripts/thread-safety.sh). mu() names the lock in
// such annotations only: it is const, so nobody locks through it. A
// method called with the lock held that must wait for I/O releases it
// with Unlock() and takes it back with Relock() before it returns (the
// analysis checks that too). RecordPrefaulted takes the lock itself.
//
// One condition variable per kind of waiter (Waiter), each waited on with
// the lock held (Wait, WaitUntil) and woken (Wake) by the changes it
// waits for:
//   kSlot     a free or ready slot (BeginSave, loads), draining;
//   kArena    a rank's arena creation done (RankSlots::creating);
//   kDurable  a shard's phase or upload, a task done (WaitDurable, Drain);
//   kFetch    a peer fetch ended (OpenRestore of a fetched shard);
//   kReaper   the lease reaper's tick cut short (stopping).
// The persistence pipeline's queues have locks of their own (persister.h,
// uploader.h), taken after this one when a change queues work.
#ifndef CKPT_DAEMON_STATE_JOB_TABLE_H_
#define CKPT_DAEMON_STATE_JOB_TABLE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/catalog.h"
#include "daemon/core/lease_table.h"
#include "daemon/core/peer_creds.h"
#include "daemon/core/rank_slots.h"
#include "daemon/core/retention.h"
#include "daemon/core/step_state.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/state/effects.h"

namespace ckpt::daemon {

struct Job {
  catv1::JobRecord rec;
  std::map<uint32_t, RankSlots> ranks;
  std::map<uint64_t, Step> steps;
  // False while a first Register creates the job: the catalog records a
  // job only once one of its arenas exists.
  bool recorded = true;
  // Every step was deleted: the record goes and the arenas are unlinked
  // once no lease, save or load uses the job (Engine::MaybeForgetJob).
  bool forget_when_idle = false;
  // The newest generation a Register of this job carried (in memory):
  // another world size is adopted only from a newer one.
  std::optional<uint64_t> registered_generation;
  // By rank, the process that last opened a restore of it and the step:
  // that process may save a step >= it below the rank's newest (a
  // restarted trainer resuming from an older step), dropping the newer
  // ones. In memory only; kept on the job, not the rank's arena, because
  // a restore from a file needs no arena.
  struct Restorer {
    pid_t pid = 0;
    uint64_t step = 0;
  };
  std::map<uint32_t, Restorer> restored_by;
};

// What the daemon's configuration decides in the job table's transitions.
struct TableRules {
  PersistRetryPolicy persist_retry;
  bool upload = false;  // an object tier: durable shards are uploaded
  // The object tier is the commit tier: a shard is reported durable once
  // uploaded, not once persisted.
  bool object_commit = false;
  // This node's name in its manifests' keys (cluster mode; "" otherwise).
  std::string node_id;
};

class JobTable {
 public:
  using Rules = TableRules;
  JobTable() = default;
  explicit JobTable(Rules rules) : rules_(std::move(rules)) {}

  // Holds the table's lock for its scope. Unlike absl::MutexLock it may
  // release the lock (Unlock) for the I/O a request waits for and take it
  // back (Relock); it releases it at the end of its scope if held.
  class ABSL_SCOPED_LOCKABLE Lock {
   public:
    explicit Lock(JobTable* table) ABSL_EXCLUSIVE_LOCK_FUNCTION(table->mu_)
        : table_(table) {
      table_->mu_.Lock();
    }
    ~Lock() ABSL_UNLOCK_FUNCTION() {
      if (held_) table_->mu_.Unlock();
    }
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    void Unlock() ABSL_UNLOCK_FUNCTION() {
      table_->mu_.Unlock();
      held_ = false;
    }
    void Relock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
      table_->mu_.Lock();
      held_ = true;
    }

   private:
    JobTable* const table_;
    bool held_ = true;
  };

  // The lock, for annotations (see the thread-safety paragraph above).
  const absl::Mutex& mu() const ABSL_LOCK_RETURNED(mu_) { return mu_; }
  // For a helper that the analysis cannot follow (it holds another
  // pointer to the table): fails unless the lock is held.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK(mu_) { mu_.AssertHeld(); }
  // For a method called with the lock held (a Lock of its caller's) that
  // waits for I/O: releases the lock, then takes it back before returning.
  void Unlock() ABSL_UNLOCK_FUNCTION(mu_) { mu_.Unlock(); }
  void Relock() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_) { mu_.Lock(); }

  enum class Waiter { kSlot, kArena, kDurable, kFetch, kReaper };
  // Wakes every waiter of that kind.
  void Wake(Waiter w) { cv(w).SignalAll(); }
  // Waits (releasing the lock meanwhile) until woken.
  void Wait(Waiter w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { cv(w).Wait(&mu_); }
  // The same, until `deadline` at the latest: false once it passed.
  bool WaitUntil(Waiter w, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Peer fetches of a PREFETCH in flight, by (job, step, rank): an
  // OpenRestore of one waits (kFetch) until it ends. EndFetch wakes them.
  void BeginFetch(const std::string& job, uint64_t step, uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    fetching_.insert({job, step, rank});
  }
  void EndFetch(const std::string& job, uint64_t step, uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Fetching(const std::string& job, uint64_t step, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return fetching_.count({job, step, rank}) != 0;
  }

  // The job `name` as `peer` may use it: the name is valid
  // (InvalidArgument), the job exists (NotFound) and the peer is root or
  // the job's owner (PermissionDenied).
  [[nodiscard]] absl::StatusOr<Job*> FindFor(const std::string& name,
                                             const PeerCreds& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job `name`, or nullptr.
  Job* Find(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Job* Find(const std::string& name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Register's job: the existing one (PermissionDenied for another
  // owner), or a new one, not yet recorded (`recorded` false), owned by
  // `uid`. Another world size is the job resized by its launcher (elastic
  // continuation) when `generation` is newer than every generation a
  // Register of the job carried (and the job takes it), else
  // InvalidArgument naming world_size: a trainer started by hand with the
  // wrong size changes nothing.
  [[nodiscard]] absl::StatusOr<Job*> FindOrAdd(
      const std::string& name, uint32_t uid, uint32_t world_size,
      uint32_t num_slots, std::optional<uint64_t> generation = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds `job` (its record names it) unless one of that name exists;
  // returns the table's job.
  Job& Add(Job job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether nothing uses `job` any more: no step, no lease, no arena being
  // created, every slot free (none persisted, loaded or read).
  bool Unused(const Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the job (its arenas must be dropped already).
  void Erase(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    jobs_.erase(name);
  }
  // Removes a job that a refused first Register left without any arena.
  void EraseIfUnrecorded(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registered rank `rank` of `job`: below the world size
  // (InvalidArgument), with an arena (FailedPrecondition).
  [[nodiscard]] static absl::StatusOr<RankSlots*> FindRank(Job& job,
                                                           uint32_t rank);
  // The shard of (job, step, rank), or nullptr.
  Shard* FindShard(const std::string& job, uint64_t step, uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Moves `shard` of `job` to phase `to` (shard_phase.h's legal
  // transitions; an illegal one is refused and logged) and mirrors the
  // phase into the slot holding it, if any. Returns whether it moved.
  bool MoveShard(Job& job, Shard& shard, ShardPhase to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh save generation (Shard::gen), unique in this table.
  uint64_t NextGen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_gen_++; }
  // A committed save enters the table: `shard` (staged, its image in slot
  // `slot` of its rank) gets a fresh generation, its slot holds it, and
  // it replaces whatever the step held for its rank. The job is in use
  // again. Returns the shard's generation.
  uint64_t AddCommitted(Job& job, RankSlots& rank, uint32_t slot, Shard shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard failed for good (kFailed, with `error`). False when it could
  // not move there (already failed, or gone from memory and disk).
  bool FailShard(Shard& shard, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard's image in memory is no longer usable (it failed
  // verification): its slot frees (or its last reader frees it) and the
  // shard is restorable only from storage.
  static void DropImage(Job& job, Shard& shard);
  // The shards of rank `rank_no` of `job` whose image is in `slot` (in
  // any slot of the rank with kAnySlot) are no longer in memory: their
  // slot is unset. Returns them with their steps; the slot table is the
  // caller's to change.
  static constexpr int kAnySlot = -1;
  static std::vector<std::pair<uint64_t, Shard*>> DetachSlot(Job& job,
                                                             uint32_t rank_no,
                                                             int slot);
  // Removes the shard of (step, rank) from `job`: its slot frees (or is
  // freed by its persister or last reader), the step's manifests no
  // longer count, an empty step goes. Returns whether there was one.
  bool EraseShard(Job& job, uint64_t step, uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The prefaulter's outcome for `arena` (prefaulter.h), published into the
  // rank that holds it: every slot ready (or, with an error, only those it
  // had), `registered` with the backend; wakes the slot waiters. Takes
  // mu() itself (the one method that does). False when no rank holds the
  // arena any more (dropped meanwhile).
  bool RecordPrefaulted(const std::shared_ptr<shm::Arena>& arena,
                        const absl::Status& status, bool registered)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes lease `id` and undoes what it held on its slot: an unfinished
  // write frees the slot, a read drops one reader (a FILE restore's lease
  // holds no slot). Returns the lease, nullopt if there was none.
  std::optional<Lease> ReleaseLease(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Transitions that return what the caller must do (effects.h) instead
  // of doing it.
  //
  // A committed save enters the table (AddCommitted; *gen its
  // generation): its record (not synced), its STAGED report and its
  // persist task.
  Effects Commit(Job& job, RankSlots& rank, uint32_t slot, Shard shard,
                 uint64_t* gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A persist's outcome for `task`, whose file is `key`, at `now`
  // (PersistVerdictOf decides): durable (its record, synced; its upload,
  // DURABLE report and the step's manifest as due), a retry (its task, not
  // before now + the verdict's delay), abandoned (the shard fails: its
  // record and retraction, and retention runs), or an orphan (the file
  // goes, and the job if it is to be forgotten).
  struct PersistResult {
    Effects effects;
    PersistVerdict verdict;
    uint32_t attempts = 0;  // failed attempts of the save so far
    uint64_t bytes = 0;     // durable: the shard's bytes
  };
  PersistResult Persisted(const PersistTask& task, const std::string& key,
                          PersistOutcome outcome,
                          std::chrono::steady_clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The coordinator's report of `shard`: staged, durable or, with
  // `failed`, retracted.
  ShardReport ReportOf(const Shard& shard, bool durable,
                       bool failed = false) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The upload of a durable shard not yet uploaded, else nullopt.
  static std::optional<UploadTask> UploadOf(const Job& job, const Shard& shard);
  // An upload of `task` (to `key`) ended: the shard is in the object tier
  // (its record, not synced; its DURABLE report when that is the commit
  // tier; the step's object manifest when due), or, when the shard went
  // meanwhile, the object goes too.
  Effects Uploaded(const UploadTask& task, const std::string& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard failed for good (FailShard, with `error`): its record,
  // synced, and its STAGED report retracted, so that no plan chooses its
  // step again. Nothing when it could not move there.
  Effects Fail(Shard& shard, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the step's local manifest is due: complete and durable, not
  // written yet, and no local copy of it deleted by retention.
  bool ManifestDue(const Job& job, uint64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The write of the step's object manifest, when due: complete, durable,
  // every shard uploaded and the manifest not written yet.
  std::optional<UploadTask> ObjectManifestDue(const Job& job,
                                              uint64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Cluster mode: the ranks of `job` this node hosts (nullptr: every rank
  // counts). SetHosting returns whether anything changed.
  const Hosting* HostingOf(const std::string& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SetHosting(const std::string& job, Hosting now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // StepComplete (retention.h) with the job's hosting.
  bool StepComplete(const Job& job, const Step& step, bool* durable) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Committed shards not yet durable (staged or persisting), all jobs.
  size_t NotDurable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `job` holds that is not yet durable: the steps with such a shard,
  // the shards and their bytes (Status, metrics, NotDurable).
  struct InFlight {
    uint64_t steps = 0;
    uint64_t shards = 0;
    uint64_t bytes = 0;
  };
  static InFlight InFlightOf(const Job& job);

  // The readers' view (List, Status, metrics): calls fn(job) for every
  // job `uid` may see — root every job, another uid its own — in name
  // order; with `only` non-empty, for that job alone.
  template <typename Fn>
  void ForEachVisible(uint32_t uid, const std::string& only, Fn fn) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, job] : jobs_) {
      if (!only.empty() && name != only) continue;
      if (uid != 0 && uid != job.rec.uid()) continue;
      fn(job);
    }
  }

  // The same jobs as pointers, for a caller that asks the table about
  // each (the analysis does not follow a lock into a callback).
  std::vector<const Job*> Visible(uint32_t uid, const std::string& only) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<const Job*> jobs;
    ForEachVisible(uid, only, [&](const Job& job) { jobs.push_back(&job); });
    return jobs;
  }
  // Every job, in name order, for a change that may touch any of them.
  template <typename Fn>
  void ForEachJob(Fn fn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& [name, job] : jobs_) fn(job);
  }
  // The leases (lease_table.h), under the table's lock.
  LeaseTable& leases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return leases_; }

 private:
  absl::CondVar& cv(Waiter w) {
    switch (w) {
      case Waiter::kSlot:
        return slot_cv_;
      case Waiter::kArena:
        return arena_cv_;
      case Waiter::kDurable:
        return durable_cv_;
      case Waiter::kFetch:
        return fetch_cv_;
      case Waiter::kReaper:
        break;
    }
    return reaper_cv_;
  }

  const Rules rules_{};
  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Hosting> hosted_ ABSL_GUARDED_BY(mu_);
  uint64_t next_gen_ ABSL_GUARDED_BY(mu_) = 1;
  std::multiset<std::tuple<std::string, uint64_t, uint32_t>> fetching_
      ABSL_GUARDED_BY(mu_);
  absl::CondVar slot_cv_;
  absl::CondVar arena_cv_;
  absl::CondVar durable_cv_;
  absl::CondVar fetch_cv_;
  absl::CondVar reaper_cv_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_STATE_JOB_TABLE_H_
