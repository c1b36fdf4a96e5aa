// Engine: one ckptd's RPC front and composition root. It wires the job
// table (the in-memory state), the catalog writer, the persistence
// pipeline and the prefaulter, and turns each RPC into: validate the
// request → change the job table under its lock → queue the catalog edit
// of the change (written outside the lock) → hand work to the pipeline.
//
// The daemon is authoritative for slot states; it mirrors them into each
// arena's header for tools and clients but never reads them back, so a
// client that scribbles over shared memory cannot corrupt the daemon's
// view (only its own data, which the checksums then reject).
//
// Every RPC of the Ckptd service maps onto one method that takes the
// caller's credentials; arguments are validated here and errors name the
// field. A lease whose holder process exits (seen through a pidfd) is
// released, so a trainer killed mid-save leaves no slot locked.
//
// Where each concept lives:
//   job_table.h    jobs, ranks, slots, steps, leases and hosting in
//                  memory: lookups, shard/slot transitions, queries (List,
//                  Status and metrics read through ForEachVisible and
//                  InFlightOf), the lock and the per-waiter condition
//                  variables;
//   lease_table.h  the leases and the reaper's poll of their holders;
//   rank_slots.h   one rank's arena, slot table, slot policy and mirror;
//   shard_phase.h  a shard's lifecycle: its legal transitions, and the
//                  slot, catalog and RPC states derived from it;
//   step_state.h   a step's shards (plain data) and where a restore
//                  reads one from (RestoreCopyOf);
//   pipeline.h     persist -> manifest -> upload and the deletes: the
//                  queues (persister.h, uploader.h) and all their I/O,
//                  reading the state through Snapshot*() and reporting
//                  through Record*() (engine_persist.cc, engine_tier.cc);
//   shard_drops.h  dropping a shard (its catalog edit planned, then
//                  applied) and the deletes owed to storage, recorded as
//                  intents and redone after a crash;
//   effects.h      what a transition of the job table hands the Engine
//                  to do: the catalog edit, tasks, reports, wakes;
//   retention.h    which steps are complete, durable or dropped (local
//                  retention's whole decision: ShardsToDrop), and the
//                  node manifest's contents;
//   prefaulter.h   the background fault-in and registration of new arenas'
//                  slots, published into the job table;
//   arena_drops.h  the unregister, unlink and unmap of dropped arenas;
//   metrics.h      the Prometheus metrics it updates and reports;
//   catalog.h, catalog_writer.h  the catalog (records: proto/catalog.proto)
//                  and its edits, applied in order and group-synced
//                  outside the job table's lock.
// engine_options.h holds its options and the reports it sends. The method
// files: engine.cc (Open, Register, BeginSave, AbortSave, leases, the
// reaper), engine_arena.cc (a rank's arena: create, grow, drop),
// engine_commit.cc (CommitSave), engine_restore.cc (Latest,
// OpenRestore's choice of source, loads), engine_fallback.cc (CloseRestore, the
// fallback ladder), engine_query.cc (WaitDurable, List, Status),
// engine_persist.cc (a persist's and a manifest's snapshot and record,
// retention, Drain), engine_tier.cc (the same for uploads, tiered retention),
// engine_deletes.cc (Delete), engine_cluster.cc (hosted ranks,
// reports, Prefetch), engine_recover.cc (recovery from the catalog),
// engine_replica.cc (peer replicas: staged snapshots, fetches from peers).
//
// Thread-safety: all methods are safe to call concurrently. The job
// table's lock ("the lock" below, taken through JobTable::Lock; what needs
// it is annotated, and clang checks it) guards the table only. The
// queues (persist, upload, catalog writer, arena drops, prefaulter) each
// have their own lock, taken after the table's when a change queues work
// and never held while they call out; a stage takes the table's lock only
// through PipelineState's Snapshot/Record, with no lock of its own held.
// Each kind of waiter has its own condition variable (slot, arena, durable
// in the table; the queues' idle waiters in the queues; the reaper's
// here), notified only by the changes it waits for.
//
// No I/O runs under the lock: disk and object I/O (a restore's check of
// the file it hands out included), catalog writes, checksum passes, arena
// creation and an arena's drop (DropArena hands it to ArenaDrops, whose
// thread unregisters, unlinks and unmaps it; a new arena of the same name waits
// for the unlink) run outside it. A state change queues its catalog edit
// (CatalogWriter) in the same critical section, so edits land in the order of
// the changes; whoever needs the outcome (CommitSave, a new or grown arena,
// Prefetch, a delete that waits for its intent; Delete, WaitDurable and a
// bad-copy CloseRestore before they answer) waits with the lock released. A
// rank's arena is created (or grown, beside the old one) with the lock released
// while RankSlots::creating makes other requests for that rank wait; the
// Prefaulter (its own lock) readies the slots beyond slot 0 in the background
// and publishes them into the job table (JobTable::RecordPrefaulted), never
// calling the engine.
//
// No callback runs under the lock either: the reports for the node agent
// (on_shard/on_fallback) are queued in the order of the changes and
// delivered once the lock is released (Section). Transitions of the job
// table return their effects (effects.h): a commit's and a persist's
// (JobTable::Commit, JobTable::Persisted); the Engine queues their edit
// in the same critical section (Apply) and pushes their tasks after
// unlocking (Perform). Still in the Engine: CommitSave's re-planning when
// its superseded drops changed while their edit was written
// (WriteSuperseded). Restore's choice of copy is RestoreCopyOf,
// and what a persist's outcome does to its shard PersistVerdictOf
// (step_state.h; JobTable::Persisted applies it); retention's decisions, both
// tiers', are retention.h's (ApplyRetention and
// ApplyTieredRetention apply them).
#ifndef CKPT_DAEMON_ENGINE_H_
#define CKPT_DAEMON_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "daemon/arena_drops.h"
#include "daemon/catalog.h"
#include "daemon/catalog_writer.h"
#include "daemon/effects.h"
#include "daemon/engine_options.h"
#include "daemon/job_table.h"
#include "daemon/lease_table.h"
#include "daemon/metrics.h"
#include "daemon/peer_listener.h"
#include "daemon/persister.h"
#include "daemon/pipeline.h"
#include "daemon/prefaulter.h"
#include "daemon/rank_slots.h"
#include "daemon/retention.h"
#include "daemon/shard_drops.h"
#include "daemon/staged_shards.h"
#include "daemon/step_state.h"
#include "daemon/uploader.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

class Engine : public StagedShards, private PipelineState {
 public:
  // The table's lock for one request or task (a JobTable::Lock) that,
  // whenever it releases the lock, delivers the reports the changes made
  // under it queued: no callback runs under the lock.
  class ABSL_SCOPED_LOCKABLE Section {
   public:
    explicit Section(Engine* engine)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(engine->table_.mu());
    ~Section() ABSL_UNLOCK_FUNCTION();
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;
    void Unlock() ABSL_UNLOCK_FUNCTION();
    void Relock() ABSL_EXCLUSIVE_LOCK_FUNCTION();

   private:
    Engine* const engine_;
    JobTable::Lock lock_;
    bool held_ = true;
  };

  // Recovers from the catalog: re-attaches arenas, re-queues staged steps
  // that were not yet durable, and starts the persister and the reaper.
  // backend, catalog and object (the object tier, or nullptr for none)
  // must outlive the engine.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Open(
      EngineOptions options, storage::Backend* backend, Catalog* catalog,
      storage::Backend* object = nullptr);
  ~Engine() override;

  [[nodiscard]] absl::StatusOr<v1::RegisterResponse> Register(
      const PeerCreds& peer, const v1::RegisterRequest& req);
  [[nodiscard]] absl::StatusOr<v1::BeginSaveResponse> BeginSave(
      const PeerCreds& peer, const v1::BeginSaveRequest& req);
  [[nodiscard]] absl::Status CommitSave(const PeerCreds& peer,
                                        const v1::CommitSaveRequest& req);
  absl::Status AbortSave(const PeerCreds& peer,
                         const v1::AbortSaveRequest& req);
  [[nodiscard]] absl::StatusOr<v1::LatestResponse> Latest(
      const PeerCreds& peer, const v1::LatestRequest& req);
  [[nodiscard]] absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(
      const PeerCreds& peer, const v1::OpenRestoreRequest& req);
  [[nodiscard]] absl::Status CloseRestore(const PeerCreds& peer,
                                          const v1::CloseRestoreRequest& req);
  absl::Status WaitDurable(const PeerCreds& peer,
                           const v1::WaitDurableRequest& req);
  [[nodiscard]] absl::StatusOr<v1::ListResponse> List(
      const PeerCreds& peer, const v1::ListRequest& req);
  absl::StatusOr<v1::DeleteResponse> Delete(const PeerCreds& peer,
                                            const v1::DeleteRequest& req);
  // Root sees every job's arenas; any other uid only its own jobs'.
  v1::StatusResponse Status(const PeerCreds& peer);

  // Cluster mode: the ranks of `job` this node hosts now (from the
  // coordinator), and the oldest step the job may still restore (the
  // global last good step or the plan's restore step): retention never
  // deletes it or anything newer, and deletes nothing while it is unknown.
  // Without a call, every rank of the job counts.
  void SetHostedRanks(const std::string& job, std::vector<uint32_t> ranks,
                      std::optional<uint64_t> keep_from);
  // Loads `rank`'s shard of `step` from storage `key` into the rank's arena
  // so that a restore finds it in memory (a coordinator's PREFETCH order).
  // Creates the job when this node does not know it yet, owned by
  // `owner_uid`: the uid the job's trainers ran as on the nodes that
  // reported its shards (the order carries it). Without one (an older
  // coordinator) the shard file's owner, which is wrong on a root-squashed
  // or object-store shared root. Blocking; the key must be one of the
  // rank's shard keys.
  [[nodiscard]] absl::Status Prefetch(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      const std::string& key, std::optional<uint32_t> owner_uid = std::nullopt);

  // Peer replicas (engine_replica.cc, doc/replicas.md). StagedShards: the
  // replicate stage's and the replica listener's reads of this node's
  // shards in memory.
  absl::StatusOr<StagedCopy> SnapshotStaged(const std::string& job,
                                            std::optional<uint64_t> step,
                                            uint32_t rank) override;
  bool StagedUnchanged(const std::string& job, uint32_t rank,
                       const StagedCopy& snap) override;
  // A PREFETCH fetches these ranks' shards from peers: an OpenRestore of
  // one of them waits (the table's kFetch waiter) until EndFetch instead of
  // failing.
  void BeginFetches(const std::string& job, uint64_t step,
                    const std::vector<uint32_t>& ranks);
  void EndFetch(const std::string& job, uint64_t step, uint32_t rank);
  // Fetches `rank`'s shard of `step` from a peer straight into a slot of
  // the rank's arena (creating the job as Prefetch does), verifies it
  // (VerifyReplicaImage) and keeps it in memory: durable under `key` when
  // the step is stored, else staged and persisted here. `fetch` runs the
  // transfer (GetReplica), asking its callback where the bytes go.
  // `save_digests` (ShardSource.save_digests) name the save wanted: a copy
  // whose checksums digest is none of them is another save of the step,
  // refused (DataLoss naming digest); empty: any.
  using PeerFetch = std::function<absl::StatusOr<replica::v1::ShardCopy>(
      const std::function<absl::StatusOr<char*>(
          const replica::v1::ShardCopy&)>&)>;
  [[nodiscard]] absl::Status FetchFromPeer(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      const std::string& key, std::optional<uint32_t> owner_uid,
      const PeerFetch& fetch, std::vector<uint64_t> save_digests = {});

  // Cluster mode, once, after the node's first registration: reports every
  // shard recovered from the catalog at Open that is still here (STAGED,
  // then DURABLE when it is durable in the commit tier). Their reports of
  // the previous life went under an epoch the coordinator has ended, so
  // without this it never learns that they are durable.
  void ReportRecovered();

  // Refuses new saves from now on and waits until every committed shard is
  // durable (or failed for good) or the deadline passes. Returns how many
  // shards were still not durable.
  size_t Drain(std::chrono::milliseconds deadline);
  // Waits until the persister has nothing queued or running (tests, tools);
  // false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Lock-free: answers even while a thread of the engine is wedged.
  EngineProgress Progress() const;
  // The object tier's backlog and counters (for Status and metrics);
  // nullopt without an object tier. Takes only the uploader's lock.
  std::optional<UploadBacklog> ObjectBacklog() const;

 private:
  // One rank's arena and slot table (rank_slots.h).
  using Rank = RankSlots;

  Engine(EngineOptions options, storage::Backend* backend, Catalog* catalog,
         storage::Backend* object);
  // Both run in Open, before any other thread exists: without the lock,
  // which they would hold across the catalog's reads and the arenas' maps.
  [[nodiscard]] absl::Status Recover() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  void RecoverJob(Job& job, std::vector<catv1::ShardRecord> shards)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The shards Recover found (each save by its generation), for
  // ReportRecovered; guarded by the lock.
  struct RecoveredShard {
    std::string job;
    uint64_t step = 0;
    uint32_t rank = 0;
    uint64_t gen = 0;
  };
  std::vector<RecoveredShard> recovered_ ABSL_GUARDED_BY(table_.mu());

  // Helpers. Those annotated ABSL_EXCLUSIVE_LOCKS_REQUIRED need the job
  // table's lock held; clang checks every caller (scripts/thread-safety.sh).
  // Returns the rank's arena, creating or growing it to slot_bytes. The
  // creation runs with `lock` released (Rank::creating marks it); a refusal
  // leaves the rank's old arena and its steps as they were.
  [[nodiscard]] absl::StatusOr<Rank*> EnsureArena(const std::string& job,
                                                  uint32_t rank,
                                                  uint64_t slot_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Unmaps the rank's arena (and with `unlink` removes its name); the
  // rank's shards are then no longer in memory.
  void DropArena(Job& job, uint32_t rank_no, bool unlink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // OpenRestore: waits while a peer fetch of the shard runs.
  [[nodiscard]] absl::Status WaitFetch(const std::string& job, uint64_t step,
                                       uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Drops the job and its record if Delete marked it and nothing uses it.
  void MaybeForgetJob(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  std::string ArenaName(const std::string& job, uint32_t rank) const;
  // Releases lease `id` (JobTable::ReleaseLease); the end of a FILE
  // restore's lease lets the deletes it held back go.
  void ReleaseLease(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // The fallback ladder: a client found `shard`'s `copy` failing
  // verification. Drops the slot's image; a bad local file with a copy in
  // the object tier is dropped (restores read the object next); with no
  // good copy left the shard fails (Latest falls back a step).
  void MarkBadCopy(Job& job, Shard& shard, ShardCopy copy,
                   const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // A client claimed `shard`'s `copy` bad, and the daemon's own check
  // (`checked`: OK, or why it could not run) did not find it so: the copy
  // is kept, and the claim is counted and reported (FallbackReport's
  // verified_bad false).
  void ReportUnconfirmed(const Job& job, const Shard& shard, ShardCopy copy,
                         const std::string& claim, const absl::Status& checked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Drops a rank's shard of a step (ShardDrops::Drop, shard_drops.h).
  void DropShard(Job& job, uint64_t step, uint32_t rank, bool delete_file)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) {
    shard_drops_->Drop(job, step, rank, delete_file);
  }
  // CommitSave's steps: the open save the request names (its lease),
  // checked; the new shard, its metadata written into its slot and
  // validated (a refusal ends the save); and the drops of what it
  // supersedes, written with its record (and with the lock released)
  // unless there is none (fast: the record is queued with the commit).
  [[nodiscard]] absl::StatusOr<Lease> CommitLease(
      const PeerCreds& peer, const v1::CommitSaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  [[nodiscard]] absl::StatusOr<Shard> StageShard(
      const v1::CommitSaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  struct Superseded {
    Job* job = nullptr;
    std::vector<DropPlan> drops;  // to apply (their edit is written)
    CatalogEdit edit;             // to queue before the record, synced
    bool fast = false;            // nothing superseded
    bool written = false;         // the record went with the drops' edit
  };
  [[nodiscard]] absl::StatusOr<Superseded> WriteSuperseded(
      const v1::CommitSaveRequest& req, const catv1::ShardRecord& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // The commit's catalog edit, after the drops' edit it supersedes (or
  // none: the record went with the drops').
  static void ChainEdit(Superseded sup, Effects* fx);
  // An allowed rewind: logged, counted, and the restoring trainer's
  // allowance used up.
  void NoteRollback(Job& job, const v1::CommitSaveRequest& req,
                    const std::vector<uint64_t>& newer, pid_t pid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // The save's timings (metrics.h).
  void NoteCommitted(const std::string& job, const Lease& lease,
                     std::chrono::steady_clock::time_point arrived,
                     uint64_t bytes);
  // An allowed save below the rank's newest step dropped `dropped`
  // (ascending): a ROLLBACK event for Status, beside the log line.
  void RecordRollback(const Job& job, const v1::CommitSaveRequest& req,
                      const std::vector<uint64_t>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // A commit whose record could not be written after it changed memory
  // (the fast path): the shard goes again, and its STAGED report is
  // retracted.
  void UndoCommit(const std::string& job, uint64_t step, uint32_t rank,
                  uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // `sync` for QueueEdit of a record that describes only this node's
  // shared memory (a staged or fetched shard, a job's arenas): not synced.
  // A machine crash loses the memory with the record; a daemon crash keeps
  // the write in the page cache; and the write-ahead log is one sequence,
  // so the next synced write (a shard's persist, a delete's intent) makes
  // every earlier record durable with it. A commit or a replacement's fetch
  // then waits for no disk sync (each ~0.1 s on a slow disk).
  static constexpr bool kMemoryOnly = false;
  // Queues a catalog edit (in the order of the state changes, the lock held).
  uint64_t QueueEdit(CatalogEdit edit, bool sync)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) {
    return writer_->Enqueue(std::move(edit), sync);
  }
  // The shard failed for good (its persist gave up, every copy failed
  // verification): records it, and tells the coordinator so that no plan
  // chooses its step.
  void FailShard(Shard& shard, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  void MaybeQueueManifest(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  void ApplyRetention(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Restore's one decision: the path the caller may read the durable
  // shard's file (`key`, of image_bytes) from itself (a local file of the
  // recorded size that the caller's uid can open), or nullopt: the daemon
  // loads it into a slot. Stats the file: called without the lock.
  std::optional<std::string> ClientReadablePath(const PeerCreds& peer,
                                                const std::string& key,
                                                uint64_t image_bytes);
  // Loads a durable shard into a free slot of its rank's arena; releases
  // the lock during the read. Returns the shard, which may have moved.
  // *from_object (optional) says whether it came from the object tier.
  [[nodiscard]] absl::StatusOr<Shard*> LoadShard(const std::string& job,
                                                 uint64_t step, uint32_t rank,
                                                 double* load_s,
                                                 bool* from_object = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Reads a shard image into dst from the local tier, or from the object
  // tier when the local copy is gone (or unreadable and uploaded);
  // verifies the object's tensor checksums. Called without the lock.
  [[nodiscard]] absl::Status ReadShardImage(const std::string& key, bool local,
                                            bool object,
                                            const storage::ShardInfo& info,
                                            char* dst, uint64_t bytes,
                                            bool* from_object);
  // This node's manifest of a step (storage/keys.h).
  std::string NodeManifestKey(const std::string& job, uint64_t step) const {
    return storage::ManifestKey(job, step, options_.node_id);
  }
  // A rank's shard file. In cluster mode it names the node too: a fenced
  // node that wakes up mid-persist must not replace the file its
  // replacement wrote for the same step and rank.
  std::string NodeShardKey(const std::string& job, uint64_t step,
                           uint32_t rank) const {
    return storage::ShardKey(job, step, rank, options_.node_id);
  }
  // Reports the shard to the coordinator (cluster mode): staged, durable
  // or, with `failed`, retracted. Queued (Outbox) and delivered once
  // the lock is released.
  void ReportShard(const Shard& shard, bool durable, bool failed = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // A report to the node agent (on_shard, on_fallback), queued in the
  // order of the changes; nothing without the callback.
  using Report = std::variant<ShardReport, FallbackReport>;
  void Outbox(Report report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Delivers the queued reports, in order, up to the `upto`-th ever
  // queued at least; called with the lock released (Section does).
  void Deliver(uint64_t upto) ABSL_LOCKS_EXCLUDED(table_.mu());
  // Executes a transition's effects (effects.h). Apply, in the
  // transition's critical section: queues the edit (returns its ticket,
  // 0 for none), the deletes' intents and the reports. Perform, with the
  // lock released: pushes the tasks and wakes the waiters.
  uint64_t Apply(Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  void Perform(Effects fx) ABSL_LOCKS_EXCLUDED(table_.mu());
  // The pipeline's view of the state (pipeline.h): each takes the lock. The
  // persist and manifest halves are in engine_persist.cc, the upload's in
  // engine_tier.cc.
  std::optional<PersistSnapshot> SnapshotPersist(
      const PersistTask& task) override;
  void RecordPersist(const PersistTask& task, PersistOutcome outcome) override;
  std::optional<ManifestSnapshot> SnapshotManifest(const std::string& job,
                                                   uint64_t step, bool object,
                                                   bool* written) override;
  bool RecordManifest(const std::string& job, uint64_t step, bool object,
                      const ManifestSnapshot& m,
                      const absl::Status& status) override;
  absl::StatusOr<UploadSnapshot> SnapshotUpload(
      const UploadTask& task) override;
  bool SlotUnchanged(const UploadTask& task,
                     const UploadSnapshot& snap) override;
  void RecordUpload(const UploadTask& task, const std::string& key,
                    uint64_t bytes, double seconds) override;

  // The object tier (engine_tier.cc). Whether a shard counts as durable in
  // the commit tier.
  bool CommitDurable(const Shard& shard) const {
    return shard.phase == ShardPhase::kDurable &&
           (options_.commit_tier == EngineOptions::CommitTier::kLocal ||
            shard.uploaded);
  }
  bool ObjectCommit() const {
    return object_ != nullptr &&
           options_.commit_tier == EngineOptions::CommitTier::kObject;
  }
  void QueueUpload(const Job& job, const Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  void MaybeQueueObjectManifest(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Retention with an object tier: local copies of steps below the local
  // cutoff go once the step is in the object tier; steps below the object
  // cutoff go from both, object manifest first.
  void ApplyTieredRetention(Job& job, const Hosting* hosting)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Deletes the local files of a step in the object tier (manifest first).
  void DropLocalCopy(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // The same for one shard of it (the step's local manifest goes too).
  void DropLocalShard(Job& job, uint64_t step_no, Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  // Queues the object tier's deletes of a step: its manifest, then the
  // shards that were uploaded.
  void QueueObjectDelete(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu());
  void ReapLoop();
  // The gauges of a scrape (engine_metrics.cc); takes the lock.
  MetricsSnapshot Snapshot();

  const EngineOptions options_;
  const std::shared_ptr<DaemonMetrics> metrics_;
  storage::Backend* const backend_;
  Catalog* const catalog_;
  storage::Backend* const object_;  // the object tier, or nullptr
  const std::chrono::steady_clock::time_point started_;

  // Jobs, ranks, slots, steps, leases and hosting, with the lock and
  // the waiters' condition variables (job_table.h).
  JobTable table_;
  // Guarded by the table's lock; stopping_ wakes the reaper (kReaper).
  bool draining_ ABSL_GUARDED_BY(table_.mu()) = false;
  bool stopping_ ABSL_GUARDED_BY(table_.mu()) = false;
  uint64_t persisted_shards_ ABSL_GUARDED_BY(table_.mu()) = 0;
  uint64_t persisted_bytes_ ABSL_GUARDED_BY(table_.mu()) = 0;
  uint64_t failed_persists_ ABSL_GUARDED_BY(table_.mu()) = 0;
  // The newest events (Status answers them to the jobs' owners), with the
  // uid of the job each is about; the oldest go past kMaxEvents.
  struct OwnedEvent {
    uint32_t uid = 0;
    v1::DaemonEvent event;
  };
  static constexpr size_t kMaxEvents = 256;
  std::deque<OwnedEvent> events_ ABSL_GUARDED_BY(table_.mu());
  // Reports queued under the lock (Outbox), how many ever were, and
  // how many were delivered; deliver_mu_ keeps their order across the
  // threads that deliver them (taken before the table's lock, never
  // under it).
  std::vector<Report> outbox_ ABSL_GUARDED_BY(table_.mu());
  uint64_t queued_reports_ ABSL_GUARDED_BY(table_.mu()) = 0;
  std::atomic<uint64_t> delivered_reports_{0};
  absl::Mutex deliver_mu_;
  // Applies catalog edits in order outside the lock (catalog_writer.h).
  std::unique_ptr<CatalogWriter> writer_;
  // Write leases whose CommitSave waits for its record outside the lock.
  std::set<uint64_t> committing_ ABSL_GUARDED_BY(table_.mu());
  // Persist, manifest, upload and deletes (pipeline.h); persister_ and
  // uploader_ (null without an object tier) are its queues, each with its
  // own lock (taken after the table's, never before it).
  std::unique_ptr<PersistPipeline> pipeline_;
  Persister* persister_ = nullptr;
  std::thread reaper_;
  std::atomic<uint64_t> reaper_ticks_{0};
  std::unique_ptr<Prefaulter> prefaulter_;
  Uploader* uploader_ = nullptr;
  // Unregisters, unlinks and unmaps dropped arenas off the lock.
  std::unique_ptr<ArenaDrops> arena_drops_;
  // Drops shards and queues the deletes owed to storage (shard_drops.h).
  std::unique_ptr<ShardDrops> shard_drops_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_H_
