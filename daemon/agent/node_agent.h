// NodeAgent: ckptd's side of a multi-node job. It registers this node with
// the coordinator, heartbeats, passes the rank placement to the engine,
// reports every shard as staged and then durable, and carries out the
// coordinator's orders: PREFETCH loads shards from the shared root into
// this node's shared memory (on its own thread, so heartbeats go on) and is
// acknowledged when done; RESTART and STOP are acknowledged at once, since
// ckptrun acts on them through the job's generation. Handling is
// idempotent: an order the coordinator sends again after its
// acknowledgement (which it may lose: acknowledgements are not durable
// before the heartbeat's answer) is acknowledged again and not re-run.
//
// Fencing: each report carries the epoch the node had when the shard was
// committed, so a node declared dead (timed out, SIGSTOPped) cannot make the
// coordinator count anything it committed before it re-registered. When a
// heartbeat is refused for its epoch, the agent registers again (a new
// epoch) and drops the reports of the old one. A shard committed while the
// node has no epoch (fenced and not registered again yet, or before its
// first registration) is never reported: it belongs to a generation the
// coordinator gave up on, and must not count under the next epoch. What
// the engine recovered from its catalog at start (a ckptd restart) is
// reported once, after the first registration (Engine::ReportRecovered):
// the coordinator forgot it with the previous life's epoch.
//
// Reports go in batches: one ReportShards call carries every report
// queued (all ranks of this node), after a short gathering delay. A batch
// answered UNAVAILABLE, DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED (the
// coordinator sheds load) is retried with exponential backoff and jitter;
// no report is ever dropped for it. Per-rank reports are soft state on the
// coordinator: the agent keeps the ones it sent for steps not yet known
// committed, and when the coordinator's incarnation changes (it restarted)
// it sends them again (STAGED, then DURABLE), ahead of anything queued.
//
// The coordinator may be down or restarting: reports wait in order and are
// retried; the engine never waits on the coordinator. Thread-safe.
//
// Restore fallbacks (ReportFallback: a copy failed verification) go out on
// the same thread, one call each, ahead of the next batch of reports; they
// are few, so they are bounded in number and age rather than kept forever.
#ifndef CKPT_DAEMON_AGENT_NODE_AGENT_H_
#define CKPT_DAEMON_AGENT_NODE_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator.pb.h"
#include "coordinator/client/tls.h"
#include "daemon/agent/beacons.h"
#include "daemon/agent/net_probe.h"
#include "daemon/agent/peer_fetch.h"
#include "daemon/engine/engine.h"
#include "daemon/replica/node_replicas.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_store.h"
#include "daemon/replica/replicator.h"

namespace grpc {
class ClientContext;
}

namespace ckpt::daemon {

// The coordinator's form of one of the engine's shard reports (what
// ReportShards carries).
void ToReportProto(const ShardReport& report, coord::v1::ShardReport* out);

struct NodeAgentOptions {
  std::string coordinator;  // HOST:PORT[,HOST:PORT...] (HA replicas: the leader
                            // is followed)
  // HOST:PORT of a ckpt-relay (--coordinator-relay): heartbeats and report
  // batches go through it, every other call to `coordinator`. A call the
  // relay cannot carry goes directly at once, and the agent stays direct
  // for a backoff (2 s doubling to 30 s, jittered). A heartbeat's deadline
  // at the relay is at most the heartbeat interval. "": no relay.
  std::string relay;
  // Called (if set) for each call the relay could not carry that went to
  // the coordinator directly, and for each heartbeat answered (`relayed`:
  // through the relay). ckptd counts them (doc/metrics.md).
  std::function<void()> on_relay_fallback;
  std::function<void(bool relayed)> on_heartbeat;
  coordinator::TlsFiles
      tls;  // the node's certificate must name node_id (CN or subjectAltName)
  std::string node_id;
  std::string address;    // advertised to the coordinator (MASTER_ADDR)
  uint32_t capacity = 8;  // ranks this node can host
  bool spare = false;
  // The node's health check at start (health.h), sent with every
  // registration; empty: none ran.
  coord::v1::NodeHealthReport health_report;
  std::chrono::milliseconds rpc_timeout{3000};
  // Order ids remembered as carried out (to acknowledge a re-sent one
  // again without running it twice): the newest this many. Ids only grow,
  // and an order is re-sent only while its plan is current.
  size_t remembered_orders = 1024;
  // A fallback report not accepted this long after ReportFallback (the
  // coordinator unreachable, the node fenced) is dropped with a log line.
  std::chrono::milliseconds fallback_ttl{std::chrono::minutes(5)};
  // At most this many fallback reports wait; the oldest is dropped past it.
  size_t max_queued_fallbacks = 256;
  // The engine's arena prefix: the hosted ranks' progress beacons are read
  // there and reported with each heartbeat (beacons.h). Empty: none.
  std::string shm_prefix;
  std::string huge_dir;  // the arenas' hugetlbfs (EngineOptions::huge_dir)
  // The network check (net_probe.h): the listener's port (-1: none, the
  // node is left out; 0: any free one), bound to `address` when that is
  // an IPv4 address, else to every interface. net_probe_slow: test-only
  // (CKPTD_TEST_FAULT=slow-network).
  int net_probe_port = -1;
  bool net_probe_slow = false;
  // Test-only (CKPTD_TEST_FAULT=hang-prefetch): every PREFETCH order hangs
  // before it reads anything, never acknowledged, until the agent stops (a
  // replacement wedged on its shared root).
  bool hang_prefetch = false;
  // Health re-checks: runs the node's checks (health.h) on a
  // thread of its own; the report goes with a later heartbeat. Run when
  // the coordinator asks (`ckptctl health`, a spare about to take ranks)
  // and, while the node hosts no ranks, every health_recheck on its own
  // (a spare stays checked; a busy node is not disturbed). Null: never.
  std::function<coord::v1::NodeHealthReport()> health_check;
  std::chrono::milliseconds health_recheck{std::chrono::minutes(5)};
  // Peer replicas (doc/replicas.md): the node's failure domain and replica
  // listener port (0: none), sent with every registration; how a PREFETCH
  // fetches from a peer (--replica-transport); and this node's replica
  // side (node_replicas.h; null: none), which outlives the agent.
  std::string domain;
  uint32_t replica_port = 0;
  ReplicaTransport replica_transport = ReplicaTransport::kBulk;
  NodeReplicas* replicas = nullptr;
  // Where the agent keeps the epoch of its last registration (written
  // after each one; "": nowhere). A restarted ckptd names it when it
  // registers, so that the coordinator lets it take over from its
  // previous life at once instead of waiting for that life to time out.
  std::string epoch_file;
};

// The heartbeat interval a coordinator told (RegisterNodeResponse and
// HeartbeatResponse.heartbeat_interval_ms), checked against its heartbeat
// timeout: 0 (an older coordinator) means timeout / 5, as before; a value
// outside [20 ms, max(timeout / 3, 20 ms)] would flood the coordinator or
// let it declare this node dead between two heartbeats, and is
// INVALID_ARGUMENT naming the field (the agent keeps its interval).
absl::StatusOr<std::chrono::milliseconds> TakeHeartbeatInterval(
    uint32_t told_ms, uint32_t timeout_ms);

class NodeAgent {
 public:
  explicit NodeAgent(NodeAgentOptions options);
  ~NodeAgent();  // stops the threads; queued reports are dropped

  // Queues a report; the engine's on_shard callback.
  void Report(const ShardReport& report);
  // The coordinator's layout index of a committed step (StepIndex), with
  // a short deadline (kStepIndexTimeout). The last one answered is kept:
  // a node's restoring ranks ask one after another (single flight), and
  // after the first the coordinator only confirms the commit's content
  // digest, so a node moves a step's index once. A restore falls back to the
  // node manifests when there is none, or no coordinator to ask.
  absl::StatusOr<std::string> StepIndex(const std::string& job, uint64_t step);
  static constexpr std::chrono::milliseconds kStepIndexTimeout{1000};
  // Queues the report that a restore fell back and returns at once: it
  // never waits on the coordinator (nor on a lock held across a call). The
  // report thread sends it under the node's epoch at that time (a
  // fallback is not tied to an epoch), retrying while the coordinator is
  // unreachable, shedding load or refusing the node's epoch or placement
  // (it re-registers; a plan moves ranks), for at most
  // options.fallback_ttl; any other refusal, or an older report, is
  // dropped with a log line. Callable before Start and from any thread.
  void ReportFallback(FallbackReport report);
  // Fallback reports the coordinator accepted, and those dropped.
  uint64_t fallbacks_sent() const { return fallbacks_sent_.load(); }
  uint64_t fallbacks_dropped() const { return fallbacks_dropped_.load(); }
  // Starts registering, heartbeating and reporting; engine must outlive
  // the agent. A null engine: no placement or prefetch (tests of the
  // control path).
  void Start(Engine* engine);
  uint64_t epoch() const { return epoch_.load(); }
  // A saved rank of a step this node does not hold, from the memory of a
  // peer that does (a restore into another layout reads it): asks the
  // coordinator where it is held (ShardSources: the owner's slot, a
  // replica) and fetches it from those peers into this node's memory,
  // verified against the save's digests (peer_fetch.h FetchFromPeers).
  // NotFound when no live node holds it; otherwise the error names every
  // peer tried. Blocking; thread-safe; after Start.
  [[nodiscard]] absl::Status FetchSavedRankFromPeers(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank);
  // The chunks of that saved rank which `ranges` of its image touch, from
  // the peers the coordinator names, verified against the save's digests
  // (peer_fetch.h FetchRangesFromPeers), into a slot held for one read.
  [[nodiscard]] absl::StatusOr<RangedSlot> FetchSavedRangesFromPeers(
      const std::string& job, uint64_t step, uint32_t rank,
      std::span<const ImageRange> ranges);
  // How often it heartbeats now (what the coordinator told, validated).
  std::chrono::milliseconds heartbeat_interval() const {
    return std::chrono::milliseconds(heartbeat_interval_ms_.load());
  }
  // Report calls answered with a retryable code and sent again.
  uint64_t report_retries() const { return report_retries_.load(); }
  // Reports sent again to a restarted coordinator.
  uint64_t reports_resent() const { return reports_resent_.load(); }
  // Reports not sent: their shard was committed while the node had no
  // epoch (see Fencing above).
  uint64_t reports_dropped() const { return reports_dropped_.load(); }
  // Reports the coordinator refused (answered with a final error), and
  // the last one's reason.
  uint64_t reports_refused() const { return reports_refused_.load(); }
  std::string last_refusal() const {
    absl::MutexLock lock(&refusal_mu_);
    return last_refusal_;
  }
  // Orders remembered (see remembered_orders) and PREFETCH threads not
  // yet joined: both bounded, whatever the number of plans.
  size_t orders_remembered();
  size_t prefetch_threads();

 private:
  // The coordinator's ShardSources answer for one saved rank, checked.
  absl::StatusOr<coord::v1::ShardSourcesResponse> SavedRankSource(
      const std::string& job, uint64_t step, uint32_t rank);
  struct Queued {
    ShardReport report;
    uint64_t epoch = 0;  // the node's epoch when the shard was committed
  };
  class Rpc;

  struct Hosting {
    std::vector<uint32_t> ranks;
    std::optional<uint64_t> keep_from;
  };
  void HeartbeatLoop();
  // Keeps a WatchNode stream open on the leading coordinator (reopening it
  // with backoff) and kicks a heartbeat as soon as it shows an order not
  // taken yet: orders arrive when they are durable, not a heartbeat
  // interval later. While the stream is down (or the coordinator is an
  // older one without WatchNode) heartbeats alone carry the orders.
  void OrderWatchLoop();
  void ApplyLoop();
  void ReportLoop();
  // Heartbeat thread: takes the orders of a heartbeat's answer (starts a
  // PREFETCH, acknowledges the others and any sent again).
  void TakeOrders(const coord::v1::HeartbeatResponse& resp);
  // node_agent_net_check.cc. Before the threads start: the probe listener.
  void StartNetProbeServer();
  // Heartbeat thread: tokens to expect registered with the listener before
  // the next heartbeat, probes to send started on threads of their own.
  void TakeNetProbes(const coord::v1::HeartbeatResponse& resp);
  // Heartbeat thread: the probe results not yet sent, into `req`; and,
  // once that heartbeat was answered, forgets them and joins the threads
  // that are done.
  void AddNetResults(coord::v1::HeartbeatRequest* req);
  void NetResultsSent(const coord::v1::HeartbeatRequest& req);
  // node_agent_health.cc, heartbeat thread: a finished re-check's report
  // into `req`; once answered, it is the report a registration sends; a
  // check the answer asks for, or one due while idle, started.
  void AddHealthReport(coord::v1::HeartbeatRequest* req);
  void TakeHealthOrder(const coord::v1::HeartbeatRequest& sent,
                       const coord::v1::HeartbeatResponse& resp);
  void StartHealthCheck(uint64_t id);
  // Under mu_ (released during each call): sends the queued fallback
  // reports in order, drops the expired and the refused; returns when the
  // queue is empty or the front must wait.
  void SendFallbacksLocked(std::unique_lock<std::mutex>& lock);
  // Under mu_: a new incarnation seen; re-queues the soft state.
  void NoteIncarnationLocked(uint64_t incarnation);
  // How this node fetches a copy from a peer (a PREFETCH, a saved rank).
  PeerFetchOptions PeerFetch() const;
  void RunPrefetch(uint64_t order_id, std::string job, uint32_t world_size,
                   uint64_t step, std::vector<uint32_t> ranks,
                   std::vector<std::string> keys,
                   std::vector<coord::v1::ShardSource> sources,
                   std::optional<uint32_t> owner_uid);
  bool WaitFor(std::chrono::milliseconds d);  // false when stopping
  std::atomic<int64_t> heartbeat_interval_ms_{0};
  // Joins the PREFETCH threads that are done, and forgets the oldest
  // carried-out orders beyond remembered_orders.
  void ReapOrders();

  const NodeAgentOptions options_;
  Engine* engine_ = nullptr;
  std::unique_ptr<Rpc> rpc_;
  std::atomic<uint64_t> epoch_{0};
  // Heartbeat thread: the engine's recovered shards were reported (after
  // the first registration).
  bool recovered_reported_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool kick_ = false;  // heartbeat now: an order is done, or one arrived
  // The newest probe the coordinator sent (NodeView.probe): a peer
  // suspects this node is gone, and a heartbeat now says it is not.
  uint64_t probe_seen_ = 0;
  grpc::ClientContext* order_watch_ctx_ = nullptr;  // the open WatchNode
  std::deque<Queued> reports_;
  // Sent and accepted, for steps not known committed: (job, step, rank) ->
  // the STAGED and (once sent) DURABLE reports.
  struct Sent {
    Queued staged;
    std::optional<Queued> durable;
  };
  std::map<std::tuple<std::string, uint64_t, uint32_t>, Sent> soft_;
  // REPLICATED reports accepted, by (job, rank): the newest copy held.
  std::map<std::pair<std::string, uint32_t>, Queued> soft_replicas_;
  uint64_t incarnation_ = 0;
  std::atomic<uint64_t> report_retries_{0};
  std::atomic<uint64_t> reports_resent_{0};
  std::atomic<uint64_t> reports_dropped_{0};
  std::atomic<uint64_t> reports_refused_{0};
  // StepIndex's kept answer; held across the call (single flight).
  struct KeptStepIndex {
    std::string job;
    uint64_t step = 0;
    uint64_t content_digest = 0;
    std::string index;
  };
  absl::Mutex step_index_mu_;
  KeptStepIndex step_index_ ABSL_GUARDED_BY(step_index_mu_);
  mutable absl::Mutex refusal_mu_;  // a leaf
  std::string last_refusal_ ABSL_GUARDED_BY(refusal_mu_);
  struct QueuedFallback {
    FallbackReport report;
    std::chrono::steady_clock::time_point queued;
    uint64_t id = 0;
  };
  uint64_t fallback_ids_ = 0;
  std::deque<QueuedFallback> fallbacks_;
  std::chrono::steady_clock::time_point next_fallback_try_;
  std::chrono::milliseconds fallback_backoff_{0};
  std::atomic<uint64_t> fallbacks_sent_{0};
  std::atomic<uint64_t> fallbacks_dropped_{0};
  uint64_t dropped_logged_ = 0;  // reports_dropped_ when the last was logged
  std::vector<uint64_t> acked_;  // to acknowledge in the next heartbeat
  // Orders taken, by id: true once carried out and acknowledged (a
  // PREFETCH runs first). An order sent again after that was acknowledged
  // in a heartbeat whose effect the coordinator lost (a crash before its
  // write was durable, a failed write, a failover): it is acknowledged
  // again, never carried out twice.
  std::map<uint64_t, bool> handled_;
  // PREFETCH threads by order id; an id in prefetched_ is done (joined by
  // the heartbeat thread, at once).
  std::map<uint64_t, std::thread> prefetchers_;
  // Health re-checks (heartbeat thread only, but for HealthRun's fields):
  // the report registrations send, the last id run, the run under way (a
  // detached thread: a hung check never holds up shutdown).
  struct HealthRun {
    std::mutex mu;
    bool done = false;
    uint64_t id = 0;
    coord::v1::NodeHealthReport report;
  };
  coord::v1::NodeHealthReport health_report_;
  uint64_t health_last_id_ = 0;
  std::shared_ptr<HealthRun> health_run_;
  std::chrono::steady_clock::time_point health_last_run_;
  std::vector<uint64_t> prefetched_;
  // Placement to pass to the engine, whose mutex may be held for seconds
  // (an arena being created): the heartbeat thread must never wait on it.
  std::map<std::string, Hosting> hosting_;
  bool hosting_changed_ = false;
  std::unique_ptr<BeaconMonitor> beacons_;      // with shm_prefix only
  std::unique_ptr<NetProbeServer> net_server_;  // net_probe_port >= 0
  // Probes this node sends, by token (once each); done ones in net_done_
  // with their result, until a heartbeat carried it.
  std::map<std::string, std::thread> net_probers_;
  std::map<std::string, coord::v1::NetProbeResult> net_done_;
  std::thread applier_;
  std::thread heartbeat_;
  std::thread order_watch_;
  std::thread reporter_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_NODE_AGENT_H_
