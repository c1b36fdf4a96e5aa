// NodeState: this node's job table and the parts that carry out its
// changes: the catalog writer (edits in the order of the changes), the
// persistence pipeline's queues, the shard and arena drops, the prefaulter
// and the reports for the node agent (queued under the lock, delivered
// after it). The Engine (the RPC front) owns one, and so do the parts it
// delegates to: the restore path (restorer.h), the replica source
// (replica_source.h), the pipeline's view of the table (pipeline_view.h)
// and recovery (recovery.h). Each takes the NodeState by reference and
// nothing else of the Engine.
//
// What a change needs done besides the table's own transition lives here
// once: executing a transition's effects (Apply under the lock, Perform
// after it), a rank's arena (created or grown outside the lock, dropped
// on ArenaDrops' thread: node_arenas.cc), and applying retention's
// decisions in both tiers (node_retention.cc).
//
// Thread-safety: the members are shared. Those annotated are guarded by
// the job table's lock (table.mu(), taken through Section); the queues
// have their own locks, taken after the table's and never held while they
// call out. The pointers are set by Wire, before any other thread exists,
// and never change after.
#ifndef CKPT_DAEMON_STATE_NODE_STATE_H_
#define CKPT_DAEMON_STATE_NODE_STATE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/engine_options.h"
#include "daemon/core/metrics.h"
#include "daemon/core/rank_slots.h"
#include "daemon/pipeline/arena_drops.h"
#include "daemon/pipeline/pipeline.h"
#include "daemon/state/effects.h"
#include "daemon/state/job_table.h"
#include "daemon/state/prefaulter.h"
#include "daemon/state/shard_drops.h"
#include "storage/backend.h"
#include "storage/keys.h"

namespace ckpt::daemon {

class NodeState {
 public:
  // The table's lock for one request or task (a JobTable::Lock) that,
  // whenever it releases the lock, delivers the reports the changes made
  // under it queued: no callback runs under the lock.
  class ABSL_SCOPED_LOCKABLE Section {
   public:
    explicit Section(NodeState* node)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(node->table.mu());
    ~Section() ABSL_UNLOCK_FUNCTION();
    Section(const Section&) = delete;
    Section& operator=(const Section&) = delete;
    void Unlock() ABSL_UNLOCK_FUNCTION();
    void Relock() ABSL_EXCLUSIVE_LOCK_FUNCTION();

   private:
    NodeState* const node_;
    JobTable::Lock lock_;
    bool held_ = true;
  };

  // backend, catalog and object (the object tier, or nullptr for none)
  // must outlive the state.
  NodeState(EngineOptions options, storage::Backend* backend, Catalog* catalog,
            storage::Backend* object);
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  // Creates the queues; the pipeline reads and records the state through
  // `state`, which must outlive them.
  void Wire(PipelineState* state);

  // Executes a transition's effects (effects.h). Apply, in the
  // transition's critical section: queues the edit (returns its ticket,
  // 0 for none), the deletes' intents and the reports. Perform, with the
  // lock released: pushes the tasks and wakes the waiters.
  uint64_t Apply(Effects& fx) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  void Perform(Effects fx) ABSL_LOCKS_EXCLUDED(table.mu());

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
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu()) {
    return writer->Enqueue(std::move(edit), sync);
  }

  // A report to the node agent (on_shard, on_fallback), queued in the
  // order of the changes; nothing without the callback.
  using Report = std::variant<ShardReport, FallbackReport>;
  void Outbox(Report report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Reports the shard to the coordinator (cluster mode): staged, durable
  // or, with `failed`, retracted.
  void ReportShard(const Shard& shard, bool durable, bool failed = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // The shard failed for good (its persist gave up, every copy failed
  // verification): records it, and tells the coordinator so that no plan
  // chooses its step.
  void FailShard(Shard& shard, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Drops a rank's shard of a step (ShardDrops::Drop, shard_drops.h).
  void DropShard(Job& job, uint64_t step, uint32_t rank, bool delete_file)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu()) {
    shard_drops->Drop(job, step, rank, delete_file);
  }
  // Releases lease `id` (JobTable::ReleaseLease); the end of a FILE
  // restore's lease lets the deletes it held back go.
  void ReleaseLease(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Drops the job and its record if Delete marked it and nothing uses it.
  void MaybeForgetJob(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());

  // A rank's arena (node_arenas.cc). Returns the rank's arena, creating or
  // growing it to slot_bytes. The creation runs with the lock released
  // (RankSlots::creating marks it); a refusal leaves the rank's old arena
  // and its steps as they were. `use`: what the caller does next.
  enum class ArenaFor {
    kSave,  // a client saves into slot 0
    // The caller loads a shard into slot 0
    // (shm::ArenaOptions::slot0_faulted_by_load).
    kLoad,
    // ... from the object tier, written through the arena's file where
    // the slot was left for that (slot0_written_through_file).
    kObjectLoad,
  };
  [[nodiscard]] absl::StatusOr<RankSlots*> EnsureArena(
      const std::string& job, uint32_t rank, uint64_t slot_bytes,
      ArenaFor use = ArenaFor::kSave) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Unmaps the rank's arena (and with `unlink` removes its name); the
  // rank's shards are then no longer in memory.
  void DropArena(Job& job, uint32_t rank_no, bool unlink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  std::string ArenaName(const std::string& job, uint32_t rank) const;

  // Retention's decisions applied (node_retention.cc; the decisions are
  // retention.h's), and the tasks a durable step or shard queues.
  void ApplyRetention(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  void MaybeQueueManifest(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  void QueueUpload(const Job& job, const Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Queues the object tier's deletes of a step: its manifest, then the
  // shards that were uploaded.
  void QueueObjectDelete(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  // Deletes the local file of one shard of a step in the object tier (the
  // step's local manifest goes too).
  void DropLocalShard(Job& job, uint64_t step_no, Shard& shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());

  // Whether a shard counts as durable in the commit tier.
  bool CommitDurable(const Shard& shard) const {
    return shard.phase == ShardPhase::kDurable &&
           (options.commit_tier == EngineOptions::CommitTier::kLocal ||
            shard.uploaded);
  }
  bool ObjectCommit() const {
    return object != nullptr &&
           options.commit_tier == EngineOptions::CommitTier::kObject;
  }
  // This node's manifest of a step (storage/keys.h).
  std::string NodeManifestKey(const std::string& job, uint64_t step) const {
    return storage::ManifestKey(job, step, options.node_id);
  }
  // A rank's shard file. In cluster mode it names the node too: a fenced
  // node that wakes up mid-persist must not replace the file its
  // replacement wrote for the same step and rank.
  std::string NodeShardKey(const std::string& job, uint64_t step,
                           uint32_t rank) const {
    return storage::ShardKey(job, step, rank, options.node_id);
  }
  // The gauges of a scrape (metrics.h); takes the lock.
  MetricsSnapshot Gauges();

  const EngineOptions options;
  const std::shared_ptr<DaemonMetrics> metrics;
  storage::Backend* const backend;
  Catalog* const catalog;
  storage::Backend* const object;  // the object tier, or nullptr
  const std::chrono::steady_clock::time_point started;

  // Jobs, ranks, slots, steps, leases and hosting, with the lock and
  // the waiters' condition variables (job_table.h).
  JobTable table;
  // Saves are refused from Drain on.
  bool draining ABSL_GUARDED_BY(table.mu()) = false;
  uint64_t persisted_shards ABSL_GUARDED_BY(table.mu()) = 0;
  uint64_t persisted_bytes ABSL_GUARDED_BY(table.mu()) = 0;
  uint64_t failed_persists ABSL_GUARDED_BY(table.mu()) = 0;
  // The shards recovery found (each save by its generation), reported once
  // the node is registered (recovery.h).
  struct RecoveredShard {
    std::string job;
    uint64_t step = 0;
    uint32_t rank = 0;
    uint64_t gen = 0;
  };
  std::vector<RecoveredShard> recovered ABSL_GUARDED_BY(table.mu());
  // Applies catalog edits in order outside the lock (catalog_writer.h).
  std::unique_ptr<CatalogWriter> writer;
  // Persist, manifest, upload and deletes (pipeline.h); persister and
  // uploader (null without an object tier) are its queues, each with its
  // own lock (taken after the table's, never before it).
  std::unique_ptr<PersistPipeline> pipeline;
  Persister* persister = nullptr;
  std::unique_ptr<Prefaulter> prefaulter;
  Uploader* uploader = nullptr;
  // Unregisters, unlinks and unmaps dropped arenas off the lock.
  std::unique_ptr<ArenaDrops> arena_drops;
  // Drops shards and queues the deletes owed to storage (shard_drops.h).
  std::unique_ptr<ShardDrops> shard_drops;

 private:
  // Delivers the queued reports, in order, up to the `upto`-th ever
  // queued at least; called with the lock released (Section does).
  void Deliver(uint64_t upto) ABSL_LOCKS_EXCLUDED(table.mu());
  void ApplyTieredRetention(Job& job, const Hosting* hosting)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  void MaybeQueueObjectManifest(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());
  void DropLocalCopy(Job& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu());

  // Reports queued under the lock (Outbox), how many ever were, and how
  // many were delivered; deliver_mu_ keeps their order across the threads
  // that deliver them (taken before the table's lock, never under it).
  std::vector<Report> outbox_ ABSL_GUARDED_BY(table.mu());
  uint64_t queued_reports_ ABSL_GUARDED_BY(table.mu()) = 0;
  std::atomic<uint64_t> delivered_reports_{0};
  absl::Mutex deliver_mu_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_STATE_NODE_STATE_H_
