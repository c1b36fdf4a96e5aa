// Coordinator: the cluster-wide state machine of a multi-node job, without
// any transport (service.h puts gRPC in front of it; ckptd can embed it for a
// one-node job). It knows every node (epoch, health), every job (rank
// placement, last good step, current recovery plan), every rank's shard of
// every recent step (staged in a node's memory / durable in the shared
// root), the orders pending for each node, and an ordered event log.
//
// Contract:
// - Placement: RegisterJob assigns ranks to alive non-spare nodes in node-id
//   order, filling each node's free capacity. Spares host nothing until a
//   plan moves a dead node's ranks onto one.
// - Epochs fence: a node gets a new epoch only from RegisterNode. A node is
//   declared dead when its last heartbeat is older than heartbeat_timeout
//   (checked by Tick() and at the start of every call); from then on every
//   request carrying its old epoch is FAILED_PRECONDITION and changes
//   nothing. RegisterNode for an id that is alive is ALREADY_EXISTS.
// - A step is durable when every rank reported DURABLE; the global manifest
//   is then written to the shared root, and only after that (in the same
//   atomic state commit as the report) does last_good_step move.
// - A failure (node dead, or a trainer exit with a non-zero code or a
//   signal) makes a plan: lost ranks move to a spare with room (or wait for
//   their node to re-register); restore step = the newest step every rank
//   can restore, from its host's memory (shard reported by that host at its
//   current epoch), the live node that saved it, a live holder's replica
//   (restore_source.h), or the shared root (DURABLE) — it may be newer
//   than last good; shard records newer than it are dropped; orders are
//   queued: PREFETCH (with each rank's source) to hosts that do not hold
//   their ranks' shards in memory, RESTART to every host, STOP to the dead
//   node for ranks it lost. Orders go out in Heartbeat responses until
//   acknowledged by a later Heartbeat.
// - Replicas: each node hosting ranks is told a replica target
//   (replica_placement.h) in its heartbeats; holders report REPLICATED,
//   checked against the rank's STAGED save. A holder's death drops its
//   replicas; a refusal re-places them (replica_refusals.h).
// - Durable state (nodes and epochs, jobs with placement, last good step and
//   plans, orders, events) changes in memory under the state mutex and goes
//   into one batch per call; batches are made durable by group commit (one
//   writer thread, one synced write for every batch waiting). A call
//   returns after its batch, and every batch before it, is durable. If a
//   write fails the in-memory state is reloaded from the store, under a
//   new incarnation (the per-rank reports are gone with it).
// - Soft state: per-rank shard reports (staged / durable / replicated)
//   are kept in memory only. A restarted coordinator has a new
//   incarnation(); nodes that see it send their reports of uncommitted
//   steps again. Only the commit of a step (global manifest written, then
//   last good moved) is durable.
// - Reports come one per call (ReportShard) or as a node's batch
//   (ReportShards, one result per report: a refused report does not refuse
//   the others). The global manifest is written outside the state mutex.
// - Liveness: a heartbeat records its time in a per-node atomic under a
//   separate reader lock before anything else, so it never waits behind
//   reports or disk writes to count; timeouts are found by Tick() (the
//   server's failure-detector thread) and by every call that takes the
//   state mutex, at the cost of a scan only when some node may have timed
//   out.
// - Placement: RegisterJob with nproc_per_node places at most that many
//   ranks on each node (what each launcher runs).
// Thread-safety: every method is safe to call concurrently.
#ifndef CKPT_COORDINATOR_COORDINATOR_H_
#define CKPT_COORDINATOR_COORDINATOR_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator.pb.h"
#include "coordinator/call_groups.h"
#include "coordinator/coordinator_options.h"
#include "coordinator/coordinator_records.h"
#include "coordinator/group_commit.h"
#include "coordinator/hang_model.h"
#include "coordinator/health_rechecks.h"
#include "coordinator/health_state.h"
#include "coordinator/hearing.h"
#include "coordinator/metrics.h"
#include "coordinator/net_check.h"
#include "coordinator/order_book.h"
#include "coordinator/progress_watch.h"
#include "coordinator/replica_targets.h"
#include "coordinator/restore_source.h"
#include "coordinator/store.h"
#include "storage/backend.h"
#include "storage/manifest.h"
#include "storage/object_backend.h"

namespace ckpt::coordinator {

class Coordinator {
 public:
  // Opens (or creates) the state, and reads back each job's last good
  // manifest: one that does not parse or check, or is missing while the
  // job's other keys are there, is dropped (event MANIFEST_INVALID) and
  // last good falls back to the previous manifest. One that is another
  // write than the commit's (a deposed leader's, landed late) proves
  // nothing about the step: the committed write (kept in the state, or
  // the same shards restamped) goes back (MANIFEST_INVALID); when it
  // cannot be rebuilt, Open fails FAILED_PRECONDITION naming the path and
  // changes nothing. A manifest that cannot
  // be read (a shared root not mounted yet: none of the job's keys there;
  // UNAVAILABLE, PERMISSION_DENIED, EIO) proves nothing: Open retries for
  // shared_root_wait, then fails UNAVAILABLE naming the path, having
  // changed nothing. Every alive node gets a fresh heartbeat timeout from
  // now, and again from StartServing.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      CoordinatorOptions options);
  // The same with the state on `kv` (etcd: etcd/etcd_kv.h); state_dir is
  // not used.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      CoordinatorOptions options, std::unique_ptr<KvBackend> kv);
  ~Coordinator();

  [[nodiscard]] absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(
      const v1::RegisterNodeRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& req);
  // The same on the caller's thread, only if the state lock is free at
  // once (a gRPC thread must not wait for it): nullopt, and nothing done
  // but Heard, when it is not (the caller queues the heartbeat). Never
  // waits for a durable write: a refusal built on changes not yet durable
  // (its node found dead by this very call) sets *durable_seq, and the
  // caller answers only after WaitDurable(*durable_seq); else 0.
  std::optional<absl::StatusOr<v1::HeartbeatResponse>> TryHeartbeat(
      const v1::HeartbeatRequest& req, uint64_t* durable_seq);
  // Waits until the group commit `seq` (TryHeartbeat's) is durable.
  absl::Status WaitDurable(uint64_t seq);
  // Heartbeats applied together: Heartbeat, TryHeartbeat and a relay's
  // batch all go through HeartbeatGroup. A request and its answer.
  struct HeartbeatCall {
    const v1::HeartbeatRequest* req = nullptr;
    bool valid = false;  // passed ValidateHeartbeat (a refusal after it is
                         // the state's: a fenced epoch, an unknown ack)
    // Unknown until run (no message: no allocation per item).
    absl::StatusOr<v1::HeartbeatResponse> out =
        absl::Status(absl::StatusCode::kUnknown, "");
  };
  // Validates each call (a refusal is its own, the others go on) and
  // hears it (Heard), then applies the valid ones in order under one hold
  // of the state lock (one batch, enqueued without waiting), each exactly
  // as a lone Heartbeat. With `try_lock`, only if the lock is free at
  // once: false, with nothing done but validation and Heard, when it is
  // not. *durable_seq: when a call was refused on changes not yet durable
  // (a node found dead by this very hold), the group commit to wait for
  // (WaitDurable) before answering the refused calls; else 0. Answering
  // (HeartbeatAnswered) is the caller's.
  bool HeartbeatGroup(const std::vector<HeartbeatCall*>& calls, bool try_lock,
                      uint64_t* durable_seq) ABSL_LOCKS_EXCLUDED(mu_);
  // The liveness part of a heartbeat alone (no state lock): node_id at
  // `epoch` was heard now. The server calls it for every heartbeat it
  // receives, before admission may shed the rest of the work.
  void Heard(const std::string& node_id, uint64_t epoch);
  // Its answer (or refusal) is going back now: the node's window starts
  // here, since it sends no other heartbeat before (NodeLiveness).
  void HeartbeatAnswered(const std::string& node_id, uint64_t epoch);
  // What the coordinator could hear (hearing.h): the server tells it when
  // it could not.
  Hearing& hearing() { return hearing_; }
  // coordinator_relay.cc: a relay's batch of many nodes' heartbeats and
  // ReportShards calls (RelayBatchRequest; doc/coordinator-scale.md
  // "Relays"). Its own fields: relay_id printable, 1 to kMaxRelayIdBytes;
  // at most kMaxRelayHeartbeats heartbeats and kMaxRelayReports report
  // calls. A refusal (INVALID_ARGUMENT naming the field) is the whole
  // batch's: nothing of it is heard or applied.
  static constexpr size_t kMaxRelayIdBytes = 128;
  static constexpr int kMaxRelayHeartbeats = 4096;
  static constexpr int kMaxRelayReports = 4096;
  [[nodiscard]] static absl::Status ValidateRelayBatch(
      const v1::RelayBatchRequest& req);
  // Hears (Heard) each heartbeat item with a valid node_id, the first of
  // its node in the batch: the server calls it on arrival, before
  // admission, as it does for a direct heartbeat.
  void HearRelayBatch(const v1::RelayBatchRequest& req);
  // Each item answered as its direct call would have been: a heartbeat
  // item through HeartbeatGroup (all of them in one hold of the state
  // lock), a report item through ApplyReportGroup (one hold per 64 items,
  // then one wait for the group commit), each refusal in its own
  // RelayedStatus; a refusal found before the lock (a bad field, a node's
  // second heartbeat in the batch) names the item's index:
  // "heartbeats[3].node_id: ...". Every heartbeat item is answered
  // (HeartbeatAnswered) before it returns. ValidateRelayBatch first.
  v1::RelayBatchResponse RelayBatch(const v1::RelayBatchRequest& req)
      ABSL_LOCKS_EXCLUDED(mu_);
  // RelayBatch in two halves: the state lock's work now, and what waits
  // for the group commits the answers need, answers each heartbeat item
  // and fills the answer (`req` must live until it has run; the items'
  // answers are moved into it, so it had better be on no arena). *waits:
  // whether that half waits for a durable write (else it returns at
  // once), so the server can run it on a thread that may wait.
  std::function<void(v1::RelayBatchResponse*)> ApplyRelayBatch(
      const v1::RelayBatchRequest& req, bool* waits) ABSL_LOCKS_EXCLUDED(mu_);
  // Admission shed the batch: its heartbeat items' refusal goes back now.
  void RelayBatchShed(const v1::RelayBatchRequest& req);
  [[nodiscard]] absl::StatusOr<v1::RegisterJobResponse> RegisterJob(
      const v1::RegisterJobRequest& req);
  absl::StatusOr<v1::ReportShardResponse> ReportShard(
      const v1::ReportShardRequest& req);
  // A node's batch: fenced epoch or unknown node refuses the whole call;
  // otherwise one result per report.
  [[nodiscard]] absl::StatusOr<v1::ReportShardsResponse> ReportShards(
      const v1::ReportShardsRequest& req);
  // A non-zero exit (or a signal) makes a plan, unless req.generation is
  // older than the job's: that generation was planned for already (a
  // retry whose first answer was lost), so nothing changes.
  [[nodiscard]] absl::StatusOr<v1::ReportTrainerExitResponse> ReportTrainerExit(
      const v1::ReportTrainerExitRequest& req);
  // A rank's restore fell back from a bad copy (the node RPC rules: epoch,
  // job, rank hosted by node_id; copy and next_copy "memory", "file" or
  // "object"; reason printable, at most kMaxFallbackReasonBytes;
  // next_step older than step). Records a FALLBACK event and counts it;
  // changes no plan (the node already restored), except that a claim the
  // node's check disproved (verified_bad false) counts toward the node
  // being suspect (NoteUnconfirmedClaimLocked). A refusal names the field
  // and records nothing.
  [[nodiscard]] absl::StatusOr<v1::ReportFallbackResponse> ReportFallback(
      const v1::ReportFallbackRequest& req);
  static constexpr size_t kMaxFallbackReasonBytes = 512;
  // Where saved ranks of a step are held in memory, for a node whose
  // restore reads ranks it does not hold (node RPC rules: node_id and
  // epoch; at most kMaxSourceRanks ranks, each below the step's saved
  // world size). Per rank: the owner's slot while its node serves, else a
  // live holder of a verified replica of the save, each with the save's
  // digests, and a second holder when there is one (PrefetchSourceLocked);
  // host "" when no live node holds it. Changes nothing.
  [[nodiscard]] absl::StatusOr<v1::ShardSourcesResponse> ShardSources(
      const v1::ShardSourcesRequest& req);
  static constexpr int kMaxSourceRanks = 4096;
  // The layout index of a committed step (MANIFEST.global's layout_index),
  // for a node planning a restore into another layout (node RPC rules).
  // Answered from the kept manifests (the newest kKeptManifests committed
  // steps of the job, in memory), else read from the shared root without
  // the state mutex and checked against the commit's content digest.
  // NOT_FOUND: not committed, or committed without an index. A node that
  // names the commit's content digest it holds is answered `unchanged`.
  [[nodiscard]] absl::StatusOr<v1::StepIndexResponse> StepIndex(
      const v1::StepIndexRequest& req);
  // The largest job (RegisterJob's world_size), and so the most reports one
  // ReportShards call may carry.
  static constexpr uint32_t kMaxWorldSize = 1 << 16;
  // Restart the whole job at `step`, which must have a readable global
  // manifest.
  [[nodiscard]] absl::StatusOr<v1::RollbackResponse> Rollback(
      const v1::RollbackRequest& req);
  // A held job (PLAN_HELD: max_failed_plans plans without a commit) plans
  // once more, its count reset (event JOB_RESUMED). NOT_FOUND for a job
  // not registered, FAILED_PRECONDITION for one not held; a refusal
  // changes nothing.
  [[nodiscard]] absl::StatusOr<v1::ResumeResponse> Resume(
      const v1::ResumeRequest& req);
  // A launcher's capture of its trainers' stacks after a hang (node_id
  // known, job registered, generation not newer than the job's; each
  // text at most kMaxStackBytes): kept under the job and generation (the
  // newest kept_stack_generations), event STACKS_CAPTURED.
  [[nodiscard]] absl::StatusOr<v1::ReportStacksResponse> ReportStacks(
      const v1::ReportStacksRequest& req);
  static constexpr size_t kMaxStackBytes = 256 << 10;
  // The stacks kept for a job's hang (the newest without a generation).
  [[nodiscard]] absl::StatusOr<v1::GetStacksResponse> GetStacks(
      const v1::GetStacksRequest& req);
  // coordinator_cordon.cc. Cordon keeps a node (node_id registered; reason
  // printable, 1 to kMaxCordonReasonBytes) out of placement: event
  // CORDONED, its ranks move to a spare as a dead node's do (or wait for
  // one). Uncordon lets it back (UNCORDONED); one that hosts nothing
  // becomes a spare. Either is a no-op (changed: false) when the node is
  // already so. A refusal names the field and changes nothing.
  [[nodiscard]] absl::StatusOr<v1::CordonResponse> Cordon(
      const v1::CordonRequest& req);
  [[nodiscard]] absl::StatusOr<v1::UncordonResponse> Uncordon(
      const v1::UncordonRequest& req);
  static constexpr size_t kMaxCordonReasonBytes = 512;
  // coordinator_health.cc: a launcher's own check of its node (the node RPC
  // rules; check.name printable, at most 64 bytes, reason at most 512):
  // replaces the check of that name in the node's report, which is judged
  // again (HEALTH_FAILED); jobs with ranks on a node now unhealthy plan
  // again (their ranks move to a spare).
  [[nodiscard]] absl::StatusOr<v1::ReportNodeCheckResponse> ReportNodeCheck(
      const v1::ReportNodeCheckRequest& req);
  // coordinator_health.cc: asks `node_id` (registered and alive; empty:
  // every alive node) to run its health checks now (and, with `network`,
  // starts a new round of the network check). The reports come with later
  // heartbeats (HealthRecheckLocked). A refusal names the field.
  [[nodiscard]] absl::StatusOr<v1::CheckHealthResponse> CheckHealth(
      const v1::CheckHealthRequest& req);
  v1::GetClusterResponse GetCluster();
  v1::EventsResponse Events(const v1::EventsRequest& req);

  // Reads the MANIFEST.global of each job's committed steps (without the
  // state mutex: the last good step's every call, the others
  // kAuditStepsPerCall at a time in turn) and, when one is not the write
  // its commit refers to (generation and fence differ: a deposed leader's
  // write landed after this leader's commit), writes the committed one
  // again (event MANIFEST_INVALID); one that cannot be rebuilt (neither
  // kept nor the same shards) is named once in an event. The server runs
  // it every few seconds on its own thread.
  [[nodiscard]] absl::Status AuditManifests();
  static constexpr size_t kAuditStepsPerCall = 8;

  // A digest of `m` without its generation and fence: what its commit's
  // stamp records to tell a restamped copy of the same shards.
  static uint64_t ManifestContentDigest(storage::v1::GlobalManifest m);

  // Declares nodes whose heartbeat timed out dead (and plans recovery).
  [[nodiscard]] absl::Status Tick();
  // The server starts serving this coordinator now (CoordinatorServer::
  // Start, or Promote on a new HA leader): every alive node gets a full
  // heartbeat timeout from now. Loading the state (a new leader reads it
  // from etcd after winning the election) may take a while, during which
  // no one could answer the nodes: none is judged on that time.
  void StartServing();

  // What a launcher of `job` on `node_id` needs (see WatchJob).
  v1::JobView View(const std::string& job, const std::string& node_id);
  // What node `node_id`'s agent watches (WatchNode): the orders its next
  // heartbeat would get (queued and durable, not yet acknowledged).
  v1::NodeView NodeOrders(const std::string& node_id);
  // Node `node_id`'s agent opened / ended a WatchNode stream (WatchService
  // calls them). While one is open its process lives (the kernel closes a
  // killed process's connections): a probe it has not answered by the
  // deadline waits for its answer or its heartbeat timeout instead of
  // declaring it dead (a loaded but live node is slow, not dead).
  void NodeWatchOpened(const std::string& node_id);
  void NodeWatchEnded(const std::string& node_id);
  // Counts durable changes; WaitForChange returns the count once it is
  // above `seen`, or at `deadline`.
  uint64_t WaitForChange(uint64_t seen,
                         std::chrono::steady_clock::time_point deadline);
  uint64_t incarnation() const { return incarnation_.load(); }

  const CoordinatorOptions& options() const { return options_; }

 private:
  using Batch = CoordStore::Batch;
  // One call's critical section, the preamble every state-changing call
  // shares: takes mu_, starts a batch and declares the nodes whose
  // heartbeat timed out (planning for them) before the call reads the
  // state, so no answer is built on a node that is already dead. It ends
  // with Commit (the batch made durable, mu_ released meanwhile: a call
  // answers only once what it changed is durable) or Enqueue (handed to
  // the group commit without waiting: heartbeats). A Txn that ends
  // without either enqueues its batch, so no change is ever dropped.
  // Checked by clang's -Wthread-safety like absl::MutexLock.
  class ABSL_SCOPED_LOCKABLE Txn {
   public:
    explicit Txn(Coordinator* c) ABSL_EXCLUSIVE_LOCK_FUNCTION(c->mu_);
    // Takes over mu_, already held (a TryLock that succeeded).
    struct Adopt {};
    Txn(Coordinator* c, Adopt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_);
    ~Txn() ABSL_UNLOCK_FUNCTION();
    Txn(const Txn&) = delete;
    Txn& operator=(const Txn&) = delete;
    Batch* batch() { return batch_.get(); }
    // Makes the batch durable; its error if that failed, else `result`
    // (a refusal still commits the timeouts found on the way).
    [[nodiscard]] absl::Status Commit(absl::Status result = absl::OkStatus())
        ABSL_UNLOCK_FUNCTION();
    template <typename T>
    [[nodiscard]] absl::StatusOr<T> Commit(T result) ABSL_UNLOCK_FUNCTION() {
      absl::Status s = Commit();
      if (!s.ok()) return s;
      return result;
    }
    void Enqueue() ABSL_UNLOCK_FUNCTION();
    // Enqueues the batch and releases mu_ without waiting: the group
    // commit to wait for (WaitDurable) before answering; 0 if the batch
    // was empty.
    [[nodiscard]] uint64_t EnqueueForWait() ABSL_UNLOCK_FUNCTION();
    // Enqueues the batch and releases mu_ for I/O; Relock takes it again
    // with a new batch, timeouts detected again.
    void Unlock() ABSL_UNLOCK_FUNCTION() { Enqueue(); }
    void Relock() ABSL_EXCLUSIVE_LOCK_FUNCTION();

   private:
    void Begin() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
    Coordinator& c_;
    std::unique_ptr<Batch> batch_;
    bool held_ = false;
  };
  struct PendingCommit {
    std::string job;
    uint64_t step = 0;
    uint64_t generation = 0;
    // The oldest generation its shards were saved in: the plans made
    // since are not proven by this commit.
    uint64_t saved_generation = 0;
    storage::v1::GlobalManifest manifest;
    // Every rank's layout index blob (rank order), when every rank sent
    // one: merged into manifest.layout_index outside the state mutex.
    std::vector<std::shared_ptr<const std::string>> rank_indexes;
    // ManifestContentDigest(manifest), taken with the write, outside the
    // state mutex (the index makes the manifest O(pieces)).
    uint64_t content_digest = 0;
  };
  // A report's layout index, checked before the state mutex is taken.
  struct RankIndex {
    std::shared_ptr<const std::string> blob;
    uint32_t world_size = 0;
  };

  Coordinator(CoordinatorOptions options, std::unique_ptr<CoordStore> store,
              std::unique_ptr<storage::Backend> shared);

  // coordinator_open.cc: loading and reloading the state;
  // coordinator_manifests.cc: the last good steps' manifests;
  // coordinator_commit.cc: group commit; coordinator_state.cc: indexes,
  // the event log and the checks every call shares.
  [[nodiscard]] absl::Status ReloadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the last good steps whose manifest is invalid (events
  // MANIFEST_INVALID) and commits that; UNAVAILABLE, changing nothing
  // durable, when a manifest cannot be read (ManifestInvalidLocked).
  [[nodiscard]] absl::Status VerifyManifestsLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when `read`, the failed read of a manifest, proves it invalid: the
  // manifest is corrupt (DATA_LOSS), or missing while other keys of its job
  // are there. Else UNAVAILABLE naming the shared root and the manifest.
  [[nodiscard]] absl::Status ManifestInvalidLocked(const std::string& job,
                                                   uint64_t step,
                                                   const absl::Status& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status CommitLocked(Batch* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // Open only: synchronous
  void OnCommitFailed(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_);
  void OnDurable(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_, change_mu_);
  void PutJobLocked(Batch* batch, JobState& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues a non-empty batch without waiting (heartbeats: acks and
  // delivery marks may be lost in a crash; orders are re-sent and re-acked).
  void EnqueueLocked(std::unique_ptr<Batch> batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetLiveLocked(NodeState& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat heard (owed: its answer is still to come) or answered now:
  // the node's window moves to now, unless it already expired. Under
  // live_mu_, shared.
  void MoveWindowLocked(NodeLiveness& node, bool owed);
  int64_t LastSeen(const NodeState& node) const {
    return node.live->last_seen_ms.load();
  }
  void IndexJobLocked(JobState& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PutShardLocked(JobState& job, v1::ShardRecord rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseStepLocked(JobState& job, uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Orders dropped from orders_: a node done fetching may hold replicas
  // again.
  void OrdersGoneLocked(const std::vector<v1::Order>& gone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One report of `node_id` at `epoch`; `complete` gets steps that became
  // durable on every rank.
  [[nodiscard]] absl::Status ApplyReportLocked(
      const std::string& node_id, uint64_t epoch, const v1::ShardReport& r,
      const RankIndex& index, Batch* batch, v1::ReportResult* result,
      std::vector<PendingCommit>* complete) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the manifests (state mutex released meanwhile), then moves last
  // good.
  // `done` gets the steps committed; `dropped`, those a plan made while
  // their manifest was written took out of the timeline (the manifest is
  // removed again; they are not committed).
  // One ReportShards call in a group (call_groups.h): its request, the
  // layout indexes parsed before the lock, and its answer.
  struct ReportCall {
    const v1::ReportShardsRequest* req = nullptr;
    std::vector<RankIndex> indexes;
    std::vector<absl::Status> index_checks;
    absl::StatusOr<v1::ReportShardsResponse> out =
        absl::InternalError("report call not run");
  };
  // ReportShards's checks of its request and the layout indexes parsed
  // (no lock), into `call`; a refusal names the field.
  [[nodiscard]] static absl::Status PrepareReportCall(
      const v1::ReportShardsRequest& req, ReportCall* call);
  // Applies a group of ReportShards calls under one hold of the state
  // mutex (one batch, the completed steps committed together); returns
  // what waits for the batch and answers each call.
  std::function<void()> ApplyReportGroup(const std::vector<ReportCall*>& group)
      ABSL_LOCKS_EXCLUDED(mu_);
  [[nodiscard]] absl::Status CommitSteps(
      Batch* batch, std::vector<PendingCommit> steps,
      std::set<std::pair<std::string, uint64_t>>* done,
      std::set<std::pair<std::string, uint64_t>>* dropped = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges c.rank_indexes into c.manifest's layout_index (none when they
  // do not merge: logged, the manifest goes without). No lock: O(pieces).
  void MergeStepIndex(PendingCommit& c) const;
  // Keeps `m` (a committed write) in memory and, when small enough for
  // one state write, in the state (`batch`): the newest kKeptManifests per
  // job.
  void RememberManifestLocked(Batch* batch,
                              const storage::v1::GlobalManifest& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr size_t kKeptManifests = 2;
  // Larger manifests are kept in memory only: etcd refuses a request over
  // 1.5 MiB, and the commit's batch carries the job record too.
  static constexpr size_t kMaxKeptManifestBytes = 768 << 10;
  // The committed write of `step`'s manifest: the kept one, else `found`
  // restamped when its shards are the committed ones (content digest);
  // nullopt when neither.
  std::optional<storage::v1::GlobalManifest> CommittedManifestLocked(
      const v1::JobRecord& rec, uint64_t step,
      const storage::v1::GlobalManifest* found) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Null when not kept (see manifests_).
  const storage::v1::GlobalManifest* KnownManifestLocked(const std::string& job,
                                                         uint64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `req` cannot roll back now (the job, the step, the plan), or OK.
  [[nodiscard]] absl::Status CheckRollbackLocked(
      const v1::RollbackRequest& req) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogLocked(Batch* batch, v1::EventKind kind, const std::string& job,
                 const std::string& node, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `e` with its seq and time set here.
  void LogLocked(Batch* batch, v1::Event e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  [[nodiscard]] absl::Status CheckEpochLocked(const std::string& node_id,
                                              uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobState*> HostedRankLocked(const std::string& node_id,
                                             const std::string& job,
                                             uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t HostedRanksLocked(const std::string& node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void QueueOrderLocked(Batch* batch, v1::Order order)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator.cc: the parts of a heartbeat, in the order Heartbeat runs
  // them (between them: progress and hangs, the net check, health).
  // The heartbeat interval every reply tells (heartbeat_interval.h).
  uint32_t HeartbeatIntervalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat's checks of its request (no lock).
  static absl::Status ValidateHeartbeat(const v1::HeartbeatRequest& req);
  // Heartbeat's work under the lock, into `batch` and *resp: a refusal
  // (fenced epoch, unknown acknowledgement) changes nothing.
  absl::Status HeartbeatLocked(Batch* batch, const v1::HeartbeatRequest& req,
                               v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acknowledged orders (checked by OrderBook::CheckAcks before any is
  // applied) are dropped and their plans move on.
  void ApplyAcksLocked(Batch* batch, const v1::HeartbeatRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node's deliverable orders into `resp` (ORDER_SENT the first time).
  void DeliverOrdersLocked(Batch* batch, const std::string& node_id,
                           v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_liveness.cc: progress reports and hang detection.
  // Checks a heartbeat's progress reports (before any state is touched).
  [[nodiscard]] static absl::Status ValidateProgress(
      const v1::HeartbeatRequest& req);
  // Records the reports of ranks `node_id` hosts (others are skipped: a
  // plan moved them).
  void NoteProgressLocked(const v1::HeartbeatRequest& req, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At most every progress_.scan_ms(): finds hung jobs, logs HANG_DETECTED,
  // asks the stuck ranks' nodes for stacks and plans a restart.
  void DetectHangsLocked(Batch* batch, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A window of the straggler check: slow ranks counted, named at
  // straggler_windows in a row (event STRAGGLER, metric).
  void CheckStragglersLocked(Batch* batch, JobState& job,
                             const std::vector<uint32_t>& ranks, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // coordinator_health.cc: judges alive nodes' health reports against
  // the cluster's medians; a node that turns unhealthy gets event
  // HEALTH_FAILED. Unhealthy nodes are given no ranks. `changed`: the one
  // node whose report changed, judged alone unless the medians are due
  // again (ClusterMedians); none: every node, the medians taken again.
  void JudgeHealthLocked(Batch* batch, const std::string* changed = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void JudgeNodeHealthLocked(Batch* batch, const std::string& id, NodeState& n,
                             const std::map<std::string, double>& medians)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "; spare X is unhealthy (check: reason)" per such spare: why a plan
  // found no host.
  std::string UnhealthySparesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // coordinator_health.cc: a heartbeat's health report (a re-check; taken
  // like a registration's: checks of the same names replaced, judged
  // again, a waiting plan tried again when the node is a placeable spare
  // now) and the check the node is asked to run, if any.
  void HealthRecheckLocked(Batch* batch, const v1::HeartbeatRequest& req,
                           v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How old `n`'s newest health report is (ms; see NodeState).
  int64_t HealthAgeLocked(const NodeState& n) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a spare's report is too old to give it ranks; if so, asks it
  // for a fresh one (the plan waits for the report).
  bool StaleSpareLocked(NodeState& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NextHealthRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return health_rechecks_.NextRequest();
  }
  // A restore on `node_id` claimed a copy of `job` bad that the node found
  // good (suspect_policy.h): counted; once the node is suspect, its health
  // report gets the failed check (judged: HEALTH_FAILED, its ranks move
  // like an unhealthy node's) and each such restore is an incident toward
  // its cordon. Drops nothing.
  void NoteUnconfirmedClaimLocked(Batch* batch, const std::string& node_id,
                                  const std::string& job,
                                  const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // coordinator_net_check.cc: the pairwise network check (net_check.h) at
  // a node's heartbeat: its results recorded, its probes handed out, and a
  // finished round's figures put in the nodes' reports as check "network"
  // (judged against the median like memcpy).
  void NetCheckLocked(Batch* batch, const v1::HeartbeatRequest& req,
                      v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_cordon.cc: cordoning and eviction.
  // Whether `n` may be given ranks: alive, healthy, not cordoned.
  static bool Placeable(const v1::NodeRecord& n) {
    return n.health() == v1::ALIVE && !n.unhealthy() && !n.cordoned();
  }
  // A placeable spare with room for `ranks` more ranks, or null.
  NodeState* SpareForLocked(size_t ranks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cordons `node` (event CORDONED, `by` as in v1::Cordon) and plans again
  // every job that has ranks on it.
  void CordonLocked(Batch* batch, NodeState& node, const std::string& reason,
                    const std::string& by) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cordons `node_id` as `by` when a spare can take its ranks; otherwise
  // logs EVICTION_SKIPPED saying why. True when it cordoned (and so
  // planned every job with ranks there).
  bool EvictLocked(Batch* batch, const std::string& node_id,
                   const std::string& job, const std::string& reason,
                   const std::string& by) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Charges a hang or crash (or, `kind`, a suspect node's restore) of
  // `job`'s `generation` to `node_id`; true when that made it cordoned
  // (EvictLocked).
  bool ChargeIncidentLocked(Batch* batch, const std::string& node_id,
                            const std::string& job, uint64_t generation,
                            const std::string& what,
                            IncidentKind kind = IncidentKind::kFailure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_probe.cc: a trainer's exit that lost peers (see
  // ReportTrainerExitRequest.peer_lost). Holds the exit when it suspects
  // a live node (probed now) or a probe of the job is under way; false:
  // plan it as before.
  bool HoldExitLocked(Batch* batch, JobState& job,
                      const v1::ReportTrainerExitRequest& req,
                      const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Probes whose node heartbeat since they began: answered (PROBE_ANSWERED);
  // a job whose every awaited probe is answered plans its held exits.
  void AnsweredProbesLocked(Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DetectTimeoutsLocked's part: the probed nodes past their deadline
  // without a heartbeat since the probe began and with no open connection,
  // marked not alive (live_mu_ held exclusively by the caller), with why;
  // those past it but connected, the first time, in `overdue` (the caller
  // says so); lowers `next` to the next deadline or re-check.
  void ExpiredProbesLocked(
      int64_t now, int64_t* next,
      std::vector<std::pair<std::string, std::string>>* dead,
      std::vector<std::string>* overdue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The exits `job` held, planned as failures of their own (every probe
  // answered; `answered`: the nodes that did): each is a failure (event,
  // metric, incident: a peer-lost exit's to the named peers' answering
  // hosts), one plan.
  void PlanHeldExitsLocked(Batch* batch, JobState& job, const std::string& why,
                           const std::vector<std::string>& answered)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "; folded: <each held exit>" for a plan's cause; clears them.
  std::string FoldHeldExitsLocked(JobState& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_plan.cc: failures, plans, manifests.
  void DetectTimeoutsLocked(Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the node dead and drops its pending orders; plans are the
  // caller's.
  void DeclareDeadLocked(Batch* batch, NodeState& node,
                         const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `node_id`: the failure's node when one node's (a trainer's exit), for
  // JOB_HELD. A held job plans nothing; a job that made max_failed_plans
  // plans since its last commit is held instead (HoldLocked).
  void MakePlanLocked(Batch* batch, JobState& job, const std::string& cause,
                      const std::string& node_id = "")
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holds `job` (PLAN_HELD, event JOB_HELD): a new generation that no
  // trainer may start in, the failed plan's orders dropped.
  void HoldLocked(Batch* batch, JobState& job, const std::string& cause,
                  const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `rank`'s shard of `step` is in the memory of `host` (null:
  // the rank's host in the job's record), alive in the epoch it saved in.
  bool InHostMemoryLocked(const JobState& job, uint64_t step, uint32_t rank,
                          const std::string* host = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // coordinator_elastic.cc: elastic continuation (the job shrinks when no
  // spare takes a lost node's ranks, and grows back at a commit).
  // The world size the job registered with.
  static uint32_t FullWorldSize(const v1::JobRecord& j) {
    return j.full_world_size() != 0 ? j.full_world_size() : j.world_size();
  }
  // MakePlanLocked's part when ranks have no host: shrinks the job to the
  // largest allowed world size its live ranks hold (renumbered densely,
  // STOP orders to the lost ranks' hosts, later steps dropped) and
  // returns true, or returns false when it may not (not elastic, below
  // its least size, still waiting for a spare: then it schedules the
  // wait's end). `what` says how it changed.
  bool ShrinkLocked(Batch* batch, JobState& job, std::string* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a commit of a shrunk job: when its live nodes and spares have
  // room for more ranks, a plan at the committed step grows it back
  // (to its full size, else the largest allowed size that fits).
  void GrowLocked(Batch* batch, JobState& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The world size `step` was saved at (the last good step's may differ
  // from the job's: the plans after a resize restore it).
  uint32_t SavedWorldSizeLocked(const JobState& job, uint64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the record's restore_world_size and restore_ranks for a plan
  // restoring `step`: when it was saved at another world size
  // (`saved_world_size`), each rank
  // restores a saved rank whose shard is in its own host's memory, else
  // one restorable from elsewhere. Clears them otherwise. Returns the
  // mapping for an event ("0<-0,1<-4"; empty when none).
  std::string RemapRestoreLocked(JobState& job, std::optional<uint64_t> step,
                                 uint32_t saved_world_size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard rank a plan restores for `rank` (restore_ranks, else itself).
  static uint32_t SavedRankOf(const v1::JobRecord& j, uint32_t rank) {
    return j.restore_ranks_size() > static_cast<int>(rank)
               ? j.restore_ranks(rank)
               : rank;
  }
  // Jobs whose spare wait (CoordinatorOptions::spare_wait_ms) is over are
  // planned again (they shrink); lowers next_expiry_ms_ to the next end.
  void DetectSpareWaitsLocked(Batch* batch, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest step every rank can restore (SourceOfLocked), else the last
  // good step.
  std::optional<uint64_t> RestoreStepLocked(const JobState& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropStepsAfterLocked(Batch* batch, JobState& job,
                            std::optional<uint64_t> step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropOrdersOfJobLocked(Batch* batch, const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `fetched`, when given, gets where each rank a PREFETCH names comes
  // from.
  void IssueOrdersLocked(Batch* batch, JobState& job,
                         std::optional<uint64_t> step,
                         const storage::v1::GlobalManifest* manifest,
                         std::vector<v1::RankSource>* fetched = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every rank of `step` is durable; if so and not yet committed
  // (or being committed), the manifest to write.
  bool StepCompleteLocked(JobState& job, uint64_t step,
                          std::vector<PendingCommit>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commits `c` (its manifest written) unless a plan made meanwhile took
  // the step out of the timeline: false then.
  [[nodiscard]] bool FinishStepLocked(Batch* batch, const PendingCommit& c)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdatePlanProgressLocked(Batch* batch, JobState& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the nodes that left a plan unacknowledged past plan_ack_timeout
  // and plans again; lowers next_expiry_ms_ to the next plan deadline.
  void DetectUnacknowledgedPlansLocked(Batch* batch, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LowerNextExpiryLocked(int64_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the records of the oldest steps past max_soft_steps (newer than
  // last good, not being committed).
  void TrimStepsLocked(JobState& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // coordinator_replicas.cc: replica placement, REPLICATED reports and
  // where a plan restores each rank from (restore_source.h).
  // `host`: the node that restores it (null: the rank's host).
  CopySource SourceOfLocked(const JobState& job, uint64_t step, uint32_t rank,
                            const std::string* host = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The newest step every rank restores from memory (host, own slot or
  // replica), and the newest that storage alone restores (else last good).
  std::optional<uint64_t> MemoryStepLocked(const JobState& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> DurableStepLocked(const JobState& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `r`, a report of an older generation than the job's, is of the
  // save the job's plan restores (its restore step, the digest of the save
  // the plan chose): a replacement's copy of it, fetched from a peer,
  // keeps that save's generation.
  bool RestoredSaveLocked(const JobState& job, const v1::ShardReport& r) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A REPLICATED report of holder `node_id` (ApplyReportLocked's rules for
  // the parts they share; see ShardReport.source_node).
  [[nodiscard]] absl::Status ApplyReplicaReportLocked(
      const std::string& node_id, uint64_t epoch, const v1::ShardReport& r,
      Batch* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A dead holder's replicas are gone with its memory.
  // What a PREFETCH names for `rank` of `step` restored from `first`
  // (SourceOfLocked): its peer and the save the plan chose (a fetch
  // refuses any other), and, for a peer's copy, a second live holder of a
  // verified copy of that save, in another failure domain when one is.
  v1::ShardSource PrefetchSourceLocked(const JobState& job, uint64_t step,
                                       uint32_t rank,
                                       const CopySource& first) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node `id` while it serves copies: alive at `epoch`, with a replica
  // listener; else null.
  const v1::NodeRecord* ServingLocked(const std::string& id,
                                      uint64_t epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropReplicasHeldByLocked(const std::string& holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Source -> holder (when stale: recomputed, from ReplicaCandidatesLocked);
  // a heartbeat's refusal, target.
  const std::map<std::string, std::string>& ReplicaTargetsLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<PlacementNode> ReplicaCandidatesLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReplicaTargetForLocked(Batch* batch, const v1::HeartbeatRequest& req,
                              v1::HeartbeatResponse* resp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::JobMemory JobMemoryLocked(const JobState& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Event RESTORE_SOURCES of a plan (and the restore-source counter).
  void LogRestoreSourcesLocked(Batch* batch, const JobState& job,
                               std::optional<uint64_t> step,
                               std::optional<uint64_t> newest,
                               std::optional<uint64_t> durable,
                               std::vector<v1::RankSource> fetched)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobView.trainers_may_start: the job's durable plan is ordered and no
  // RESTART of it is left unacknowledged.
  bool TrainersMayStartLocked(const JobState& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // OK when `m` is the write of its step that the job's commit refers to
  // (or the commit predates stamps); else DataLoss saying why.
  [[nodiscard]] absl::Status CheckStampLocked(
      const v1::JobRecord& rec, const storage::v1::GlobalManifest& m) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  Hearing hearing_{[this] { return options_.now_ms(); }};
  const std::unique_ptr<CoordStore> store_;
  const std::unique_ptr<storage::Backend> shared_;
  // Changes when the soft state is lost: at Open, and when a failed write
  // makes the state go back to the store (nodes then send it again).
  // The CheckHealth/stale-spare request ids and the reports' merge.
  HealthRechecks health_rechecks_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> incarnation_;

  absl::Mutex mu_;  // the state; held for memory work only, never for I/O
  // Soft: the nodes probed because an exit suspected them (NodeView.probe),
  // by node id: when the probe began, its deadline, its id, and the epoch
  // probed (a node that registers again is another life).
  struct Probe {
    int64_t started_ms = 0;
    int64_t deadline_ms = 0;
    uint64_t id = 0;
    uint64_t epoch = 0;
    std::string by;        // who suspected it, for the events
    bool overdue = false;  // its deadline passed while it was connected
  };
  // Open WatchNode streams per node (NodeWatchOpened).
  std::map<std::string, int> watched_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Probe> probes_ ABSL_GUARDED_BY(mu_);
  uint64_t last_probe_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Per job, the manifests of its last good step and the one before (read
  // at Open, written by a commit, read by Rollback; also in the state, so
  // a new process has the committed writes): what a plan restoring the
  // last good step from its manifest uses, so that no plan reads the
  // shared root under mu_. Kept across ReloadLocked (a failed write may
  // move last good back one step).
  std::map<std::string, std::map<uint64_t, storage::v1::GlobalManifest>>
      manifests_ ABSL_GUARDED_BY(mu_);
  // AuditManifests' turn among the committed steps, and the steps whose
  // manifest it found but could not rebuild (named once).
  uint64_t audit_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::pair<std::string, uint64_t>> audit_unrebuilt_
      ABSL_GUARDED_BY(mu_);
  // Per committed step, the Hash64 of the MANIFEST.global bytes an audit
  // last found to be the committed write, with that write's generation
  // and fence: the same bytes again are not decoded again (a manifest of
  // 16,384 ranks is ~1.5 MB of JSON, ~25 ms to parse). Held for a whole
  // audit; taken before mu_.
  struct AuditPassed {
    uint64_t text_hash = 0;
    uint64_t generation = 0;
    uint64_t fence = 0;
  };
  absl::Mutex audit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::map<std::pair<std::string, uint64_t>, AuditPassed> audit_passed_
      ABSL_GUARDED_BY(audit_mu_);
  std::map<std::string, NodeState> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  OrderBook orders_ ABSL_GUARDED_BY(mu_);
  // Durability of what heartbeats show: jobs changed since the last
  // enqueue, and their records by batch sequence until durable.
  std::set<std::string> dirty_jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, v1::JobRecord>> pending_recs_
      ABSL_GUARDED_BY(mu_);
  std::deque<v1::Event> events_ ABSL_GUARDED_BY(mu_);
  v1::Counters counters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_event_seq_ ABSL_GUARDED_BY(mu_) = 1;
  ProgressWatch progress_ ABSL_GUARDED_BY(mu_);
  NetCheckPlanner net_check_ ABSL_GUARDED_BY(mu_);
  // Bumped whenever the network check's node set may change (a node
  // registers or dies, a reload, a restarted check); NetCheckLocked
  // gathers the set only when it differs from the version it last saw.
  uint64_t net_nodes_version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t net_nodes_seen_ ABSL_GUARDED_BY(mu_) = 0;
  ReplicaTargets replica_targets_ ABSL_GUARDED_BY(mu_);
  ClusterMedians health_medians_ ABSL_GUARDED_BY(mu_);
  // ReportShards calls applied in groups of at most 64: a group's lock
  // hold is then ~64 nodes' items (a few ms at most), short enough for the
  // heartbeats that wait for it.
  CallGroups<ReportCall> report_groups_{64};

  std::shared_mutex live_mu_;
  std::unordered_map<std::string, std::unique_ptr<NodeLiveness>> live_;
  // No alive node can time out before this (a heartbeat only moves a
  // node's deadline later), so calls skip the scan until then.
  std::atomic<int64_t> next_expiry_ms_{INT64_MIN};

  absl::Mutex change_mu_;
  absl::CondVar change_cv_;
  uint64_t changes_ ABSL_GUARDED_BY(change_mu_) = 0;

  std::unique_ptr<GroupCommitter>
      committer_;  // last: its thread uses the above
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_H_
