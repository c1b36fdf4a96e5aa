// ckptd: serves the Ckptd gRPC service on a Unix socket until SIGTERM or
// SIGINT, then drains pending persists (bounded by --drain-seconds). With
// --coordinator it joins a multi-node job as a node (see node_agent.h);
// with --coordinator-listen it also serves the coordinator itself.
//
// Under systemd (Type=notify, $NOTIFY_SOCKET) it says READY=1 once the socket
// accepts connections (after re-attaching arenas and re-queueing staged
// steps), keeps STATUS= current, says STOPPING=1 on SIGTERM, and pings the
// watchdog ($WATCHDOG_USEC) only while the engine's reaper and persister
// make progress (daemon/watchdog.h).
//
// Test-only: CKPTD_TEST_FAULT=slow-network slows this node's network
// probes (daemon/net_probe.h); CKPTD_TEST_FAULT=hang-persist-writes makes every
// storage write hang (storage/fault_backend.h) until shutdown, to wedge the
// persister; CKPTD_TEST_FAULT=hang-prefetch makes every PREFETCH order hang
// unacknowledged (a replacement wedged on its shared root);
// CKPTD_TEST_FAULT=corrupt-replica-sends flips a byte of every
// replica chunk this node sends (on the wire, never in the slot).
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "coordinator/service.h"
#include "daemon/catalog.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "daemon/health.h"
#include "daemon/node_agent.h"
#include "daemon/options.h"
#include "daemon/peer_listener.h"
#include "daemon/replica_metrics.h"
#include "daemon/replica_reports.h"
#include "daemon/replica_service.h"
#include "daemon/replica_store.h"
#include "daemon/replicator.h"
#include "daemon/service.h"
#include "daemon/watchdog.h"
#include "storage/fault_backend.h"
#include "storage/open_backend.h"
#include "util/dir_lock.h"
#include "util/metrics_server.h"
#include "util/program.h"
#include "util/service_notify.h"

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "ckptd: %s: %s\n", what.c_str(),
               std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::daemon;
  if (ckpt::PrintedVersion(argc, argv, "ckptd", CKPT_VERSION)) return 0;
  // Signals go to the main thread's sigwait, never to a worker thread.
  const sigset_t sigs = ckpt::BlockSignals({SIGTERM, SIGINT});
  std::string help;
  auto opts = ParseDaemonOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    return Fail("bad arguments", opts.status());
  }
  signal(SIGPIPE, SIG_IGN);
  if (opts->health_check) {
    const auto results = RunHealthChecks(opts->health);
    std::string failed;
    for (const auto& r : results)
      if (!r.passed()) failed += (failed.empty() ? "" : ", ") + r.name;
    std::fputs(opts->health_json ? (HealthJson(results) + "\n").c_str()
                                 : HealthText(results).c_str(),
               stdout);
    if (!failed.empty())
      std::fprintf(stderr, "ckptd: health check failed: %s\n", failed.c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    // Without static destructors: a timed-out check's thread may still run.
    std::_Exit(failed.empty() ? 0 : 1);
  }
  // Every connection costs a descriptor; gRPC uses epoll, not select(), so
  // the soft limit can go up to the hard one (systemd's default soft limit
  // is 1024).
  rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 &&
      nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE,
                    &nofile);  // best effort: the old limit still works
  }

  std::error_code ec;
  std::filesystem::create_directories(opts->root, ec);
  if (ec)
    return Fail("--root " + opts->root, absl::InternalError(ec.message()));
  // One ckptd per root, named when refused; held until exit.
  auto root_lock = ckpt::DirLock::Acquire(opts->root, "ckptd", "--root");
  if (!root_lock.ok()) return Fail("--root", root_lock.status());
  auto backend = ckpt::storage::NewLocalBackend(opts->storage);
  if (!backend.ok()) return Fail("storage", backend.status());
  ckpt::storage::Backend* storage = backend->get();
  std::unique_ptr<ckpt::storage::FaultInjectionBackend> fault;
  bool corrupt_replicas = false;
  if (const char* f = std::getenv("CKPTD_TEST_FAULT");
      f != nullptr && f[0] != '\0') {
    if (std::strcmp(f, "corrupt-replica-sends") == 0) {
      corrupt_replicas = true;
      LogWarning(
          "TEST-ONLY FAULT: CKPTD_TEST_FAULT=corrupt-replica-sends: every "
          "replica this node sends is damaged on the wire");
    } else if (std::strcmp(f, "slow-network") == 0) {
      opts->agent.net_probe_slow = true;
      LogWarning(
          "TEST-ONLY FAULT: CKPTD_TEST_FAULT=slow-network: this node's "
          "network probes run at about 6 MB/s");
    } else if (std::strcmp(f, "hang-prefetch") == 0) {
      opts->agent.hang_prefetch = true;
      LogWarning(
          "TEST-ONLY FAULT: CKPTD_TEST_FAULT=hang-prefetch: every PREFETCH "
          "order hangs, never acknowledged");
    } else if (std::strcmp(f, "hang-persist-writes") == 0) {
      fault = std::make_unique<ckpt::storage::FaultInjectionBackend>(storage);
      fault->HangWrites();
      storage = fault.get();
      LogWarning(
          "TEST-ONLY FAULT: CKPTD_TEST_FAULT=hang-persist-writes: every "
          "storage write hangs");
    } else {
      return Fail("CKPTD_TEST_FAULT",
                  absl::InvalidArgumentError(
                      "only \"hang-persist-writes\", \"hang-prefetch\", "
                      "\"slow-network\" and \"corrupt-replica-sends\" are "
                      "known (test-only)"));
    }
  }
  const ckpt::ServiceNotifier notifier;
  notifier.Status("re-attaching arenas and replaying staged steps");
  auto catalog = Catalog::Open(opts->root + "/.catalog");
  if (!catalog.ok()) return Fail("catalog", catalog.status());
  std::unique_ptr<ckpt::storage::Backend> object_tier;
  if (!opts->object_url.empty()) {
    ckpt::storage::OpenBackendOptions o;
    o.field = "--object-url";
    o.object = opts->object_config;
    // A directory stands in for a remote store (tests, a second disk): the
    // page cache is fine.
    o.local.direct_io = false;
    auto opened = ckpt::storage::OpenBackend(opts->object_url, o);
    if (!opened.ok()) return Fail("object tier", opened.status());
    object_tier = std::move(*opened);
  }
  if (!opts->shared_root.empty() &&
      !ckpt::storage::IsObjectUrl(opts->shared_root)) {
    std::filesystem::create_directories(opts->shared_root, ec);
    if (ec)
      return Fail("--shared-root " + opts->shared_root,
                  absl::InternalError(ec.message()));
  }
  // Embedded coordinator: the same state machine and service as
  // ckpt-coordinator, its state next to the catalog.
  std::unique_ptr<ckpt::coordinator::CoordinatorServer> coordinator;
  std::shared_ptr<ckpt::coordinator::CoordinatorMetrics> coordinator_metrics;
  if (!opts->coordinator_listen.empty()) {
    ckpt::coordinator::CoordinatorOptions co;
    coordinator_metrics =
        std::make_shared<ckpt::coordinator::CoordinatorMetrics>();
    co.metrics = coordinator_metrics;
    co.state_dir = opts->root + "/.coordinator";
    co.shared_root = ckpt::storage::IsObjectUrl(opts->shared_root)
                         ? opts->shared_root
                         : opts->storage.root;
    co.heartbeat_timeout =
        std::chrono::milliseconds(opts->heartbeat_timeout_ms);
    co.object_config = opts->object_config;
    auto c = ckpt::coordinator::Coordinator::Open(co);
    if (!c.ok()) return Fail("coordinator", c.status());
    auto server = ckpt::coordinator::CoordinatorServer::Start(
        std::move(*c), opts->coordinator_listen);
    if (!server.ok()) return Fail("coordinator", server.status());
    coordinator = std::move(*server);
    std::string host =
        opts->coordinator_listen.substr(0, opts->coordinator_listen.rfind(':'));
    // A loopback host (options.cc allows no other); the node agent dials it.
    const std::string dial = host.rfind("127.", 0) == 0 ? host
                             : host == "localhost"      ? "127.0.0.1"
                                                        : "[::1]";
    opts->agent.coordinator = dial + ":" + std::to_string(coordinator->port());
    LogInfo("coordinator listening on " + host + ":" +
            std::to_string(coordinator->port()));
    std::printf("coordinator listening on %s:%d\n", host.c_str(),
                coordinator->port());
    std::fflush(stdout);
  }
  // Metrics are served before recovery starts, so a long re-attach is
  // visible; the engine's gauges appear once it is open.
  auto metrics = std::make_shared<DaemonMetrics>();
  opts->engine.metrics = metrics;
  std::unique_ptr<ckpt::MetricsServer> metrics_server;
  auto replica_metrics = std::make_shared<ReplicaMetrics>();
  if (!opts->metrics_listen.empty()) {
    std::vector<std::weak_ptr<prometheus::Collectable>> collected{
        metrics, replica_metrics};
    if (coordinator_metrics) collected.push_back(coordinator_metrics);
    auto started = ckpt::MetricsServer::Start(opts->metrics_listen,
                                              "--metrics-listen", collected);
    if (!started.ok()) return Fail("metrics", started.status());
    metrics_server = std::move(*started);
    LogInfo("metrics on http://" + metrics_server->address() + "/metrics");
    std::printf("metrics listening on %s\n", metrics_server->address().c_str());
    std::fflush(stdout);
  }
  // The node's health, before READY and before it registers: the
  // coordinator gives an unhealthy node no ranks (health.h).
  notifier.Status("running health checks");
  const auto health = RunHealthChecks(opts->health);
  for (const auto& r : health) {
    const std::string line = "health " + HealthText({r});
    if (r.passed())
      LogInfo(line.substr(0, line.size() - 1));
    else
      LogWarning(line.substr(0, line.size() - 1));
  }
  opts->agent.health_report = ToHealthProto(health);
  opts->agent.health_check = [o = opts->health] {
    return ToHealthProto(RunHealthChecks(o));
  };
  std::unique_ptr<NodeAgent> agent;
  // Peer replicas (doc/replicas.md): the replicate stage, set once the
  // engine it reads exists; the engine's reports before that (recovery)
  // are not replicated until the rank's next save.
  std::unique_ptr<Replicator> replicator;
  std::atomic<Replicator*> replicate{nullptr};
  // The replica store, once it exists: a PREFETCH naming this node as a
  // lost rank's holder copies from it.
  std::atomic<ReplicaStore*> held_replicas{nullptr};
  if (opts->cluster) {
    opts->agent.shm_prefix = opts->engine.shm_prefix;  // beacons
    if (opts->replicas.send && !opts->replicas.fixed_target) {
      opts->agent.on_replica_target =
          [&replicate](std::optional<ReplicaPeer> target) {
            if (Replicator* r = replicate.load())
              r->SetTarget(std::move(target));
          };
      opts->agent.replica_refusal = [&replicate] {
        Replicator* r = replicate.load();
        return r ? r->Refused() : std::nullopt;
      };
    }
    opts->agent.replica_transport = opts->replicas.transport;
    opts->agent.held_replica =
        [&held_replicas](const std::string& job, uint64_t step,
                         uint32_t rank) -> std::shared_ptr<const HeldReplica> {
      ReplicaStore* store = held_replicas.load();
      return store ? store->Find(job, step, rank) : nullptr;
    };
    if (opts->replicas.send)
      opts->agent.on_prefetched = [&replicate](const std::string& job,
                                               uint64_t step, uint32_t rank) {
        if (Replicator* r = replicate.load()) r->Staged(job, step, rank);
      };
    agent = std::make_unique<NodeAgent>(opts->agent);
    opts->engine.on_shard = [a = agent.get(),
                             &replicate](const ShardReport& r) {
      a->Report(r);
      if (Replicator* rep = replicate.load(); rep != nullptr && !r.failed)
        rep->Staged(r.job, r.step, r.rank, r.durable);
    };
    opts->engine.on_fallback = [a = agent.get()](const FallbackReport& f) {
      a->ReportFallback(f);
    };
  }
  auto engine =
      Engine::Open(opts->engine, storage, catalog->get(), object_tier.get());
  if (!engine.ok()) return Fail("recovery", engine.status());
  // Before the socket accepts saves: a save's Staged() is never missed.
  if (agent && opts->replicas.send) {
    ReplicatorOptions ro;
    ro.node_id = opts->agent.node_id;
    ro.tls = opts->agent.tls;
    ro.bandwidth = opts->replicas.bandwidth;
    ro.corrupt = corrupt_replicas;
    ro.transport = opts->replicas.transport;
    replicator = std::make_unique<Replicator>(std::move(ro), engine->get());
    if (opts->replicas.fixed_target)
      replicator->SetTarget(opts->replicas.fixed_target);
    replicator->Start();
    replicate = replicator.get();
  }
  // Every return from here on stops it before the engine it reads goes.
  struct StopFirst {
    Replicator* r;
    ~StopFirst() {
      if (r != nullptr) r->Stop();
    }
  } stop_replicator{replicator.get()};
  auto listener = PeerListener::Listen(opts->socket_path, opts->listener);
  if (!listener.ok()) return Fail("socket", listener.status());

  CkptdService service(engine->get(), listener->get(), opts->root);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(opts->max_request_mib << 20));
  builder.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail("grpc", absl::InternalError("server did not start"));
  (*listener)->Start(server.get());
  std::unique_ptr<ReplicaStore> replica_store;
  std::unique_ptr<ReplicaServer> replica_server;
  if (agent && opts->replicas.port != 0) {
    // Every copy dropped (replaced, or given up for room) is withdrawn:
    // no plan names a copy this node no longer holds.
    replica_store = std::make_unique<ReplicaStore>(
        opts->replicas.memory_bytes,
        [a = agent.get()](const ckpt::replica::v1::ShardCopy& dropped) {
          a->Report(ReplicaWithdrawalOf(dropped));
        });
    ReplicaServerOptions ro;
    ro.port = static_cast<int>(opts->replicas.port);
    ro.bulk_port = static_cast<int>(opts->replicas.bulk_port);
    ro.tls = opts->agent.tls;
    ro.on_replicated = [a = agent.get()](const HeldReplica& held) {
      a->Report(ReplicatedReportOf(held));
    };
    auto started =
        ReplicaServer::Start(std::move(ro), replica_store.get(), engine->get());
    if (!started.ok()) return Fail("replicas", started.status());
    replica_server = std::move(*started);
    held_replicas = replica_store.get();
    LogInfo("replica listener on port " +
            std::to_string(replica_server->port()) + ", holding up to " +
            std::to_string(opts->replicas.memory_bytes) + " bytes, bulk port " +
            std::to_string(replica_server->bulk_port()));
  }
  replica_metrics->Attach(replica_store.get(), replicator.get());
  if (agent) agent->Start(engine->get());
  LogInfo(
      "serving on " + opts->socket_path + ", root " + opts->root +
      ", storage " + storage->name() + ", shm prefix " +
      opts->engine.shm_prefix +
      (object_tier
           ? ", object tier " + object_tier->name() + " (commit tier " +
                 (opts->engine.commit_tier == EngineOptions::CommitTier::kObject
                      ? "object)"
                      : "local)")
           : ""));
  // The listener accepts from here on: only now may systemd start trainers.
  notifier.Ready(ServingStatus((*engine)->Progress()));
  auto watchdog = StartEngineWatchdog(&notifier, engine->get());

  int sig = 0;
  sigwait(&sigs, &sig);
  LogInfo(std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
          ", draining pending persists");
  watchdog
      .reset();  // systemd's stop timeout (TimeoutStopSec=) bounds the drain
  notifier.Stopping(
      "draining: " + std::to_string((*engine)->Progress().persists_queued) +
      " persists queued");
  size_t left = (*engine)->Drain(opts->drain_deadline);
  if (fault)
    fault->ClearFaults();  // release the hung writes so the persister can stop
  if (left)
    LogWarning(
        std::to_string(left) +
        " shards not durable at the drain deadline; "
        "they stay in shared memory and a restarted ckptd persists them");
  (*listener)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  replica_metrics->Detach();
  // Stopped before the engine whose slots it reads, destroyed after the
  // engine, whose persister may still call Staged().
  if (replicator) replicator->Stop();
  if (replica_server) replica_server->Shutdown();
  agent.reset();  // before the engine it reports on
  replica_server.reset();
  engine->reset();
  replicate = nullptr;
  stop_replicator.r = nullptr;  // stopped above
  replicator.reset();
  if (coordinator) coordinator->Shutdown();
  metrics_server.reset();
  LogInfo("stopped");
  return 0;
}
