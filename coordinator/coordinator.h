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
//   current epoch) or from the shared root (DURABLE); shard records newer
//   than it are dropped; orders are queued: PREFETCH to hosts that do not
//   hold their ranks' shards in memory, RESTART to every host, STOP to the
//   dead node for ranks it lost. Orders go out in Heartbeat responses until
//   acknowledged by a later Heartbeat.
// - Every change of one call is committed to the RocksDB state atomically
//   before the call returns OK; if that commit fails the in-memory state is
//   reloaded from RocksDB, so a failed call leaves no trace.
// Thread-safety: every method is safe to call concurrently (one mutex; the
// manifest write to the shared root happens under it).
#ifndef CKPT_COORDINATOR_COORDINATOR_H_
#define CKPT_COORDINATOR_COORDINATOR_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator.pb.h"
#include "coordinator/store.h"
#include "storage/backend.h"
#include "storage/manifest.h"

namespace ckpt::coordinator {

struct CoordinatorOptions {
  std::string state_dir;    // RocksDB in <state_dir>/db
  std::string shared_root;  // global manifests go here
  std::chrono::milliseconds heartbeat_timeout{3000};
  size_t max_events = 4096;  // older events are dropped from memory and disk
  // Milliseconds on a monotonic clock; tests pass a fake one.
  std::function<int64_t()> now_ms;
};

class Coordinator {
 public:
  // Opens (or creates) the state, and reads back each job's last good
  // manifest: one that is missing or does not parse is dropped (event
  // MANIFEST_INVALID) and last good falls back to the previous manifest.
  // Every alive node gets a fresh heartbeat timeout from now.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      CoordinatorOptions options);
  ~Coordinator();

  [[nodiscard]] absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(
      const v1::RegisterNodeRequest& req);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  [[nodiscard]] absl::StatusOr<v1::RegisterJobResponse> RegisterJob(
      const v1::RegisterJobRequest& req);
  absl::StatusOr<v1::ReportShardResponse> ReportShard(const v1::ReportShardRequest& req);
  [[nodiscard]] absl::StatusOr<v1::ReportTrainerExitResponse> ReportTrainerExit(
      const v1::ReportTrainerExitRequest& req);
  // Restart the whole job at `step`, which must have a readable global
  // manifest.
  [[nodiscard]] absl::StatusOr<v1::RollbackResponse> Rollback(
      const v1::RollbackRequest& req);
  v1::GetClusterResponse GetCluster();
  v1::EventsResponse Events(const v1::EventsRequest& req);

  // Declares nodes whose heartbeat timed out dead (and plans recovery).
  [[nodiscard]] absl::Status Tick();

  const CoordinatorOptions& options() const { return options_; }

 private:
  struct NodeState {
    v1::NodeRecord rec;
    int64_t last_heartbeat_ms = 0;
  };
  struct JobState {
    v1::JobRecord rec;
    std::map<uint64_t, std::map<uint32_t, v1::ShardRecord>> steps;
  };
  using Batch = CoordStore::Batch;

  Coordinator(CoordinatorOptions options, std::unique_ptr<CoordStore> store,
              std::unique_ptr<storage::Backend> shared);

  // coordinator_state.cc: loading, committing, events, shared helpers.
  [[nodiscard]] absl::Status ReloadLocked();
  absl::Status VerifyManifestsLocked();
  [[nodiscard]] absl::Status CommitLocked(Batch* batch);
  void LogLocked(Batch* batch, v1::EventKind kind, const std::string& job,
                 const std::string& node, const std::string& detail);
  [[nodiscard]] absl::Status CheckEpochLocked(const std::string& node_id,
                                              uint64_t epoch);
  absl::StatusOr<JobState*> HostedRankLocked(const std::string& node_id, const std::string& job,
                                             uint32_t rank);
  uint32_t HostedRanksLocked(const std::string& node_id) const;
  void QueueOrderLocked(Batch* batch, v1::Order order);

  // coordinator_plan.cc: failures, plans, manifests.
  void DetectTimeoutsLocked(Batch* batch);
  // Marks the node dead and drops its pending orders; plans are the
  // caller's.
  void DeclareDeadLocked(Batch* batch, NodeState& node, const std::string& reason);
  void MakePlanLocked(Batch* batch, JobState& job, const std::string& cause);
  bool InHostMemoryLocked(const JobState& job, uint64_t step, uint32_t rank) const;
  std::optional<uint64_t> RestoreStepLocked(const JobState& job) const;
  void DropStepsAfterLocked(Batch* batch, JobState& job, std::optional<uint64_t> step);
  void DropOrdersOfJobLocked(Batch* batch, const std::string& job);
  void IssueOrdersLocked(Batch* batch, JobState& job, std::optional<uint64_t> step,
                         const storage::v1::GlobalManifest* manifest);
  [[nodiscard]] absl::Status MaybeCommitStepLocked(
      Batch* batch, JobState& job, uint64_t step,
      v1::ReportShardResponse* resp);
  void UpdatePlanProgressLocked(Batch* batch, JobState& job);

  const CoordinatorOptions options_;
  const std::unique_ptr<CoordStore> store_;
  const std::unique_ptr<storage::Backend> shared_;

  std::mutex mu_;
  std::map<std::string, NodeState> nodes_;
  std::map<std::string, JobState> jobs_;
  std::map<uint64_t, v1::Order> orders_;  // pending, by id
  std::deque<v1::Event> events_;
  v1::Counters counters_;
  uint64_t next_epoch_ = 1;
  uint64_t next_event_seq_ = 1;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_H_
