// Daemon: ckptd's composition root. Start() opens, in this order, the
// root's lock, the storage tier (and a test-only fault), the catalog, the
// object tier, the embedded coordinator (--coordinator-listen), metrics,
// the node's health checks, the node side (agent, replica store and
// replicate stage), the engine (recovery: arenas re-attached, staged steps
// re-queued), the socket and the replica listener; then it says READY to
// systemd. ServeUntil() waits for a signal, drains pending persists and
// stops everything in the reverse order of what reads what.
//
// Nothing is bound late: the engine reports to the node side, which exists
// before it; the replicate stage starts reading the engine once it is open
// (replicator.h); the agent reaches the replica side through NodeReplicas,
// which this class implements.
#ifndef CKPT_DAEMON_DAEMON_H_
#define CKPT_DAEMON_DAEMON_H_

#include <grpcpp/server.h>
#include <signal.h>

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "coordinator/service.h"
#include "daemon/agent/node_agent.h"
#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "daemon/options.h"
#include "daemon/peer_listener.h"
#include "daemon/replica/node_replicas.h"
#include "daemon/replica/replica_metrics.h"
#include "daemon/replica/replica_service.h"
#include "daemon/replica/replica_store.h"
#include "daemon/replica/replicator.h"
#include "daemon/service.h"
#include "storage/fault_backend.h"
#include "util/dir_lock.h"
#include "util/metrics_server.h"
#include "util/service_notify.h"

namespace ckpt::daemon {

class Daemon final : private NodeReplicas {
 public:
  // Opens and starts everything; an error's message starts with what
  // failed ("--root: ...", "recovery: ...").
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      DaemonOptions options);
  ~Daemon() override;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves until one of `signals` (blocked in every thread) arrives, then
  // drains pending persists, bounded by --drain-seconds.
  void ServeUntil(const sigset_t& signals);

 private:
  explicit Daemon(DaemonOptions options) : opts_(std::move(options)) {}

  absl::Status OpenStorage();
  absl::Status OpenObjectTier();
  absl::Status StartCoordinator();
  absl::Status StartMetrics();
  void CheckHealth();
  void MakeNodeSide();
  absl::Status OpenEngine();
  absl::Status StartServing();
  absl::Status StartReplicaServer();

  // The engine's reports (on_shard) in cluster mode.
  void OnShard(const ShardReport& report);

  // NodeReplicas, over replicator_ and replica_store_.
  void SetTarget(std::optional<ReplicaPeer> target) override;
  std::optional<HolderRefusal> Refused() const override;
  std::shared_ptr<const HeldReplica> Held(const std::string& job, uint64_t step,
                                          uint32_t rank) const override;
  void Prefetched(const std::string& job, uint64_t step,
                  uint32_t rank) override;

  // Declared in the order Start makes them; ~Daemon stops them in the
  // order of what reads what.
  DaemonOptions opts_;
  const ServiceNotifier notifier_;
  std::optional<DirLock> root_lock_;
  std::unique_ptr<storage::Backend> backend_;
  storage::Backend* storage_ = nullptr;  // backend_, or fault_ over it
  std::unique_ptr<storage::FaultInjectionBackend> fault_;
  bool corrupt_replicas_ = false;  // CKPTD_TEST_FAULT=corrupt-replica-sends
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<storage::Backend> object_tier_;
  std::shared_ptr<coordinator::CoordinatorMetrics> coordinator_metrics_;
  std::unique_ptr<coordinator::CoordinatorServer> coordinator_;
  std::shared_ptr<DaemonMetrics> metrics_;
  std::shared_ptr<ReplicaMetrics> replica_metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<NodeAgent> agent_;
  std::unique_ptr<ReplicaStore> replica_store_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<PeerListener> listener_;
  std::unique_ptr<CkptdService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ReplicaServer> replica_server_;
  std::unique_ptr<ServiceWatchdog> watchdog_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_DAEMON_H_
