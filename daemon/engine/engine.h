// Engine: one ckptd's RPC front. Every RPC of the Ckptd service maps onto
// one method that takes the caller's credentials; it validates the request
// (errors name the field), changes the job table under its lock, queues
// the catalog edit of the change in the same critical section and hands
// the rest of the change's effects to their owners after unlocking. A
// lease whose holder process exits (seen through a pidfd) is released by
// the reaper, so a trainer killed mid-save leaves no slot locked.
//
// The daemon is authoritative for slot states; it mirrors them into each
// arena's header for tools and clients but never reads them back, so a
// client that scribbles over shared memory cannot corrupt the daemon's
// view (only its own data, which the checksums then reject).
//
// Where each part lives (doc/architecture.md has the whole map):
//   node_state.h      the job table with what carries out its changes:
//                     the catalog writer, the pipeline's queues, shard and
//                     arena drops, the reports' outbox (Section), a rank's
//                     arena (node_arenas.cc), retention applied
//                     (node_retention.cc);
//   pipeline_view.h   the pipeline's view of the table (PipelineState:
//                     persist, manifest, upload), and Drain;
//   restorer.h        Latest, OpenRestore, loads and PREFETCH, and the
//                     fallback ladder of CloseRestore;
//   replica_source.h  peer replicas: staged snapshots, fetches from peers;
//   recovery.h        the state rebuilt from the catalog at Open.
// The Engine's own files: engine.cc (Open, Register, BeginSave, AbortSave,
// hosting, the reaper), engine_commit.cc (CommitSave), engine_query.cc
// (WaitDurable, List, Status), engine_deletes.cc (Delete).
//
// Thread-safety: all methods are safe to call concurrently. The job
// table's lock (taken through NodeState::Section; what needs it is
// annotated, and clang checks it: scripts/thread-safety.sh) guards the
// table only. The queues each have their own lock, taken after the
// table's when a change queues work and never held while they call out.
// No I/O and no callback runs under the table's lock: disk and object
// I/O, catalog writes, checksum passes and an arena's creation or drop run
// outside it, and the reports for the node agent are delivered once it is
// released. Whoever needs a queued edit's outcome (CommitSave, a new or
// grown arena, Prefetch, Delete, WaitDurable) waits with the lock
// released. Transitions of the job table return their effects (effects.h);
// NodeState::Apply queues them in the same critical section and
// NodeState::Perform pushes their tasks after unlocking.
#ifndef CKPT_DAEMON_ENGINE_ENGINE_H_
#define CKPT_DAEMON_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "daemon/core/engine_options.h"
#include "daemon/engine/pipeline_view.h"
#include "daemon/engine/replica_source.h"
#include "daemon/engine/restorer.h"
#include "daemon/replica/staged_shards.h"
#include "daemon/state/node_state.h"
#include "storage/backend.h"

namespace ckpt::daemon {

class Engine : public StagedShards {
 public:
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
      const PeerCreds& peer, const v1::LatestRequest& req) {
    return restorer_.Latest(peer, req);
  }
  [[nodiscard]] absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(
      const PeerCreds& peer, const v1::OpenRestoreRequest& req,
      Restorer::LoadProgress* progress = nullptr) {
    return restorer_.OpenRestore(peer, req, progress);
  }
  [[nodiscard]] absl::Status CloseRestore(const PeerCreds& peer,
                                          const v1::CloseRestoreRequest& req) {
    return restorer_.CloseRestore(peer, req);
  }
  // The step's layout index, merged over this node's ranks and the
  // manifests of the others (Restorer::LayoutIndex).
  [[nodiscard]] absl::StatusOr<v1::LayoutIndexResponse> LayoutIndex(
      const PeerCreds& peer, const v1::LayoutIndexRequest& req) {
    return restorer_.LayoutIndex(peer, req);
  }
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
      const std::string& key,
      std::optional<uint32_t> owner_uid = std::nullopt) {
    return restorer_.Prefetch(job, world_size, step, rank, key, owner_uid);
  }

  // Peer replicas (replica_source.h, doc/replicas.md). StagedShards: the
  // replicate stage's and the replica listener's reads of this node's
  // shards in memory.
  absl::StatusOr<StagedCopy> SnapshotStaged(const std::string& job,
                                            std::optional<uint64_t> step,
                                            uint32_t rank) override {
    return replicas_.SnapshotStaged(job, step, rank);
  }
  bool StagedUnchanged(const std::string& job, uint32_t rank,
                       const StagedCopy& snap) override {
    return replicas_.StagedUnchanged(job, rank, snap);
  }
  // A PREFETCH fetches these ranks' shards from peers: an OpenRestore of
  // one of them waits (the table's kFetch waiter) until EndFetch instead of
  // failing.
  void BeginFetches(const std::string& job, uint64_t step,
                    const std::vector<uint32_t>& ranks) {
    replicas_.BeginFetches(job, step, ranks);
  }
  void EndFetch(const std::string& job, uint64_t step, uint32_t rank) {
    replicas_.EndFetch(job, step, rank);
  }
  // Fetches `rank`'s shard of `step` from a peer straight into a slot of
  // the rank's arena (creating the job as Prefetch does), verifies it
  // (VerifyReplicaImage) and keeps it in memory: durable under `key` when
  // the step is stored, else staged and persisted here. `fetch` runs the
  // transfer (GetReplica), asking its callback where the bytes go.
  // `save_digests` (ShardSource.save_digests) name the save wanted: a copy
  // whose checksums digest is none of them is another save of the step,
  // refused (DataLoss naming digest); empty: any.
  using PeerFetch = ReplicaSource::PeerFetch;
  [[nodiscard]] absl::Status FetchFromPeer(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      const std::string& key, std::optional<uint32_t> owner_uid,
      const PeerFetch& fetch, std::vector<uint64_t> save_digests = {}) {
    return replicas_.FetchFromPeer(job, world_size, step, rank, key, owner_uid,
                                   fetch, std::move(save_digests));
  }
  // The chunks of saved rank `rank` that `ranges` touch, from a peer, into
  // a slot held for one read (ReplicaSource::FetchRangesFromPeer).
  using RangeFetch = ReplicaSource::RangeFetch;
  [[nodiscard]] absl::StatusOr<RangedSlot> FetchRangesFromPeer(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      std::optional<uint32_t> owner_uid, std::span<const ImageRange> ranges,
      const RangeFetch& fetch, const std::vector<uint64_t>& save_digests) {
    return replicas_.FetchRangesFromPeer(job, world_size, step, rank, owner_uid,
                                         ranges, fetch, save_digests);
  }

  // Cluster mode, once, after the node's first registration: reports every
  // shard recovered from the catalog at Open that is still here (STAGED,
  // then DURABLE when it is durable in the commit tier). Their reports of
  // the previous life went under an epoch the coordinator has ended, so
  // without this it never learns that they are durable.
  void ReportRecovered();

  // Refuses new saves from now on and waits until every committed shard is
  // durable (or failed for good) or the deadline passes. Returns how many
  // shards were still not durable.
  size_t Drain(std::chrono::milliseconds deadline) {
    return pipeline_view_.Drain(deadline);
  }
  // Waits until the persister has nothing queued or running (tests, tools);
  // false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout) {
    return node_.persister->WaitIdle(timeout);
  }
  // Lock-free: answers even while a thread of the engine is wedged.
  EngineProgress Progress() const;
  // The object tier's backlog and counters (for Status and metrics);
  // nullopt without an object tier. Takes only the uploader's lock.
  std::optional<UploadBacklog> ObjectBacklog() const;

 private:
  using Section = NodeState::Section;
  using Rank = RankSlots;

  Engine(EngineOptions options, storage::Backend* backend, Catalog* catalog,
         storage::Backend* object)
      : node_(std::move(options), backend, catalog, object) {}

  // CommitSave's steps: the open save the request names (its lease),
  // checked; the new shard, its metadata written into its slot and
  // validated (a refusal ends the save); and the drops of what it
  // supersedes, written with its record (and with the lock released)
  // unless there is none (fast: the record is queued with the commit).
  [[nodiscard]] absl::StatusOr<Lease> CommitLease(
      const PeerCreds& peer, const v1::CommitSaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  [[nodiscard]] absl::StatusOr<Shard> StageShard(
      const v1::CommitSaveRequest& req)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  struct Superseded {
    Job* job = nullptr;
    std::vector<DropPlan> drops;  // to apply (their edit is written)
    CatalogEdit edit;             // to queue before the record, synced
    bool fast = false;            // nothing superseded
    bool written = false;         // the record went with the drops' edit
  };
  [[nodiscard]] absl::StatusOr<Superseded> WriteSuperseded(
      const v1::CommitSaveRequest& req, const catv1::ShardRecord& rec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // The commit's catalog edit, after the drops' edit it supersedes (or
  // none: the record went with the drops').
  static void ChainEdit(Superseded sup, Effects* fx);
  // An allowed rewind: logged, counted, and the restoring trainer's
  // allowance used up.
  void NoteRollback(Job& job, const v1::CommitSaveRequest& req,
                    const std::vector<uint64_t>& newer, pid_t pid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // The save's timings (metrics.h).
  void NoteCommitted(const std::string& job, const Lease& lease,
                     std::chrono::steady_clock::time_point arrived,
                     uint64_t bytes);
  // An allowed save below the rank's newest step dropped `dropped`
  // (ascending): a ROLLBACK event for Status, beside the log line.
  void RecordRollback(const Job& job, const v1::CommitSaveRequest& req,
                      const std::vector<uint64_t>& dropped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // A commit whose record could not be written after it changed memory
  // (the fast path): the shard goes again, and its STAGED report is
  // retracted.
  void UndoCommit(const std::string& job, uint64_t step, uint32_t rank,
                  uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  void ReapLoop();

  // The state and the parts that own the requests' paths beyond the
  // front; each takes node_ (declared first: destroyed last).
  NodeState node_;
  PipelineView pipeline_view_{node_};
  Restorer restorer_{node_};
  ReplicaSource replicas_{node_};

  // stopping_ wakes the reaper (kReaper).
  bool stopping_ ABSL_GUARDED_BY(node_.table.mu()) = false;
  // The newest events (Status answers them to the jobs' owners), with the
  // uid of the job each is about; the oldest go past kMaxEvents.
  struct OwnedEvent {
    uint32_t uid = 0;
    v1::DaemonEvent event;
  };
  static constexpr size_t kMaxEvents = 256;
  std::deque<OwnedEvent> events_ ABSL_GUARDED_BY(node_.table.mu());
  // Write leases whose CommitSave waits for its record outside the lock.
  std::set<uint64_t> committing_ ABSL_GUARDED_BY(node_.table.mu());
  std::thread reaper_;
  std::atomic<uint64_t> reaper_ticks_{0};
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_ENGINE_H_
