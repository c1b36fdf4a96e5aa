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
// the persistence pipeline. Whoever changes the state (the Engine) holds
// mu(), queues the catalog edit of the change in the same critical
// section, and does every write and storage I/O with mu() released.
//
// Thread-safety: the caller holds mu() around every method (but
// RecordPrefaulted, which takes it) and every use of what a method
// returns. One condition variable per kind of waiter,
// each waited on with mu() and notified by the changes it waits for:
//   slot_cv     a free or ready slot (BeginSave, loads), draining;
//   arena_cv    a rank's arena creation done (RankSlots::creating);
//   durable_cv  a shard's phase or upload, a task done (WaitDurable,
//               Drain);
//   fetch_cv    a peer fetch ended (OpenRestore of a fetched shard).
// The persistence pipeline's queues have locks of their own (persister.h,
// uploader.h), taken after mu() when a change queues work.
#ifndef CKPT_DAEMON_JOB_TABLE_H_
#define CKPT_DAEMON_JOB_TABLE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/catalog.h"
#include "daemon/lease_table.h"
#include "daemon/peer_listener.h"
#include "daemon/rank_slots.h"
#include "daemon/retention.h"
#include "daemon/step_state.h"

namespace ckpt::daemon {

struct Job {
  catv1::JobRecord rec;
  std::map<uint32_t, RankSlots> ranks;
  std::map<uint64_t, Step> steps;
  // False while a first Register creates the job: the catalog records a
  // job only once one of its arenas exists.
  bool recorded = true;
  // Every step was deleted: the record goes and the arenas are unlinked
  // once no lease, save or load uses the job (Engine::MaybeForgetJobLocked).
  bool forget_when_idle = false;
};

class JobTable {
 public:
  std::mutex& mu() { return mu_; }
  std::condition_variable slot_cv;
  std::condition_variable arena_cv;
  std::condition_variable durable_cv;
  // Peer fetches of a PREFETCH in flight, (job, step, rank): OpenRestore
  // of one waits on fetch_cv (Engine::WaitFetchLocked) until it ends.
  std::multiset<std::tuple<std::string, uint64_t, uint32_t>> fetching;
  std::condition_variable fetch_cv;

  // The job `name` as `peer` may use it: the name is valid
  // (InvalidArgument), the job exists (NotFound) and the peer is root or
  // the job's owner (PermissionDenied).
  [[nodiscard]] absl::StatusOr<Job*> FindFor(const std::string& name,
                                             const PeerCreds& peer);
  // The job `name`, or nullptr.
  Job* Find(const std::string& name);
  const Job* Find(const std::string& name) const;
  // A Register's job: the existing one (PermissionDenied for another
  // owner, InvalidArgument for another world size), or a new one, not yet
  // recorded (`recorded` false), owned by `uid`.
  [[nodiscard]] absl::StatusOr<Job*> FindOrAdd(const std::string& name,
                                               uint32_t uid,
                                               uint32_t world_size,
                                               uint32_t num_slots);
  // Adds `job` (its record names it) unless one of that name exists;
  // returns the table's job.
  Job& Add(Job job);
  // Whether nothing uses `job` any more: no step, no lease, no arena being
  // created, every slot free (none persisted, loaded or read).
  bool Unused(const Job& job) const;
  // Removes the job (its arenas must be dropped already).
  void Erase(const std::string& name) { jobs_.erase(name); }
  // Removes a job that a refused first Register left without any arena.
  void EraseIfUnrecorded(const std::string& name);
  // The registered rank `rank` of `job`: below the world size
  // (InvalidArgument), with an arena (FailedPrecondition).
  [[nodiscard]] static absl::StatusOr<RankSlots*> FindRank(Job& job,
                                                           uint32_t rank);
  // The shard of (job, step, rank), or nullptr.
  Shard* FindShard(const std::string& job, uint64_t step, uint32_t rank);

  // Moves `shard` of `job` to phase `to` (shard_phase.h's legal
  // transitions; an illegal one is refused and logged) and mirrors the
  // phase into the slot holding it, if any. Returns whether it moved.
  bool MoveShard(Job& job, Shard& shard, ShardPhase to);
  // A fresh save generation (Shard::gen), unique in this table.
  uint64_t NextGen() { return next_gen_++; }
  // A committed save enters the table: `shard` (staged, its image in slot
  // `slot` of its rank) gets a fresh generation, its slot holds it, and
  // it replaces whatever the step held for its rank. The job is in use
  // again. Returns the shard's generation.
  uint64_t AddCommitted(Job& job, RankSlots& rank, uint32_t slot, Shard shard);
  // The shard failed for good (kFailed, with `error`). False when it could
  // not move there (already failed, or gone from memory and disk).
  bool FailShard(Shard& shard, const std::string& error);
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
  bool EraseShard(Job& job, uint64_t step, uint32_t rank);
  // The prefaulter's outcome for `arena` (prefaulter.h), published into the
  // rank that holds it: every slot ready (or, with an error, only those it
  // had), `registered` with the backend; wakes the slot waiters. Takes
  // mu() itself (the one method that does). False when no rank holds the
  // arena any more (dropped meanwhile).
  bool RecordPrefaulted(const std::shared_ptr<shm::Arena>& arena,
                        const absl::Status& status, bool registered);
  // Removes lease `id` and undoes what it held on its slot: an unfinished
  // write frees the slot, a read drops one reader (a FILE restore's lease
  // holds no slot). Returns the lease, nullopt if there was none.
  std::optional<Lease> ReleaseLease(uint64_t id);

  // Cluster mode: the ranks of `job` this node hosts (nullptr: every rank
  // counts). SetHosting returns whether anything changed.
  const Hosting* HostingOf(const std::string& job) const;
  bool SetHosting(const std::string& job, Hosting now);
  // StepComplete (retention.h) with the job's hosting.
  bool StepComplete(const Job& job, const Step& step, bool* durable) const;
  // Committed shards not yet durable (staged or persisting), all jobs.
  size_t NotDurable() const;
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
  void ForEachVisible(uint32_t uid, const std::string& only, Fn fn) const {
    for (const auto& [name, job] : jobs_) {
      if (!only.empty() && name != only) continue;
      if (uid != 0 && uid != job.rec.uid()) continue;
      fn(job);
    }
  }

  std::map<std::string, Job>& jobs() { return jobs_; }
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  LeaseTable& leases() { return leases_; }

 private:
  std::mutex mu_;
  std::map<std::string, Job> jobs_;
  LeaseTable leases_;
  std::map<std::string, Hosting> hosted_;
  uint64_t next_gen_ = 1;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_JOB_TABLE_H_
