// Daemon (daemon.h): ckptd's start, serving and stop.
#include "daemon/daemon.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/health/health.h"
#include "daemon/replica/replica_reports.h"
#include "daemon/watchdog.h"
#include "storage/open_backend.h"
#include "util/program.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// "what: message", keeping the status code.
absl::Status Named(const std::string& what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  (void)RaiseDescriptorLimit();
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  CKPT_RETURN_IF_ERROR(d->OpenStorage());
  d->notifier_.Status("re-attaching arenas and replaying staged steps");
  auto catalog = Catalog::Open(d->opts_.root + "/.catalog");
  if (!catalog.ok()) return Named("catalog", catalog.status());
  d->catalog_ = std::move(*catalog);
  CKPT_RETURN_IF_ERROR(d->OpenObjectTier());
  CKPT_RETURN_IF_ERROR(d->StartCoordinator());
  CKPT_RETURN_IF_ERROR(d->StartMetrics());
  d->CheckHealth();
  d->MakeNodeSide();
  CKPT_RETURN_IF_ERROR(d->OpenEngine());
  CKPT_RETURN_IF_ERROR(d->StartServing());
  CKPT_RETURN_IF_ERROR(d->StartReplicaServer());
  d->replica_metrics_->Attach(d->replica_store_.get(), d->replicator_.get());
  if (d->agent_) d->agent_->Start(d->engine_.get());
  const DaemonOptions& o = d->opts_;
  LogInfo(absl::StrCat(
      "serving on ", o.socket_path, ", root ", o.root, ", storage ",
      d->storage_->name(), ", shm prefix ", o.engine.shm_prefix,
      o.engine.huge_dir.empty()
          ? ", arenas in /dev/shm"
          : absl::StrCat(
                ", arenas in 2 MiB pages from ", o.engine.huge_dir,
                o.engine.huge_required ? " (required)" : " (else /dev/shm)"),
      d->object_tier_
          ? absl::StrCat(
                ", object tier ", d->object_tier_->name(), " (commit tier ",
                o.engine.commit_tier == EngineOptions::CommitTier::kObject
                    ? "object)"
                    : "local)")
          : std::string()));
  // The listener accepts from here on: only now may systemd start trainers.
  d->notifier_.Ready(ServingStatus(d->engine_->Progress()));
  d->watchdog_ = StartEngineWatchdog(&d->notifier_, d->engine_.get());
  return d;
}

absl::Status Daemon::OpenStorage() {
  std::error_code ec;
  std::filesystem::create_directories(opts_.root, ec);
  if (ec)
    return Named("--root " + opts_.root, absl::InternalError(ec.message()));
  // One ckptd per root, named when refused; held until exit.
  auto lock = DirLock::Acquire(opts_.root, "ckptd", "--root");
  if (!lock.ok()) return Named("--root", lock.status());
  root_lock_.emplace(std::move(*lock));
  auto backend = storage::NewLocalBackend(opts_.storage);
  if (!backend.ok()) return Named("storage", backend.status());
  backend_ = std::move(*backend);
  storage_ = backend_.get();
  const char* f = std::getenv("CKPTD_TEST_FAULT");
  if (f == nullptr || f[0] == '\0') return absl::OkStatus();
  if (std::strcmp(f, "corrupt-replica-sends") == 0) {
    corrupt_replicas_ = true;
    LogWarning(
        "TEST-ONLY FAULT: CKPTD_TEST_FAULT=corrupt-replica-sends: every "
        "replica this node sends is damaged on the wire");
  } else if (std::strcmp(f, "slow-network") == 0) {
    opts_.agent.net_probe_slow = true;
    LogWarning(
        "TEST-ONLY FAULT: CKPTD_TEST_FAULT=slow-network: this node's "
        "network probes run at about 6 MB/s");
  } else if (std::strcmp(f, "hang-prefetch") == 0) {
    opts_.agent.hang_prefetch = true;
    LogWarning(
        "TEST-ONLY FAULT: CKPTD_TEST_FAULT=hang-prefetch: every PREFETCH "
        "order hangs, never acknowledged");
  } else if (std::strcmp(f, "hang-persist-writes") == 0) {
    fault_ = std::make_unique<storage::FaultInjectionBackend>(storage_);
    fault_->HangWrites();
    storage_ = fault_.get();
    LogWarning(
        "TEST-ONLY FAULT: CKPTD_TEST_FAULT=hang-persist-writes: every "
        "storage write hangs");
  } else {
    return Named("CKPTD_TEST_FAULT",
                 absl::InvalidArgumentError(
                     "only \"hang-persist-writes\", \"hang-prefetch\", "
                     "\"slow-network\" and \"corrupt-replica-sends\" are "
                     "known (test-only)"));
  }
  return absl::OkStatus();
}

absl::Status Daemon::OpenObjectTier() {
  if (!opts_.object_url.empty()) {
    storage::OpenBackendOptions o;
    o.field = "--object-url";
    o.object = opts_.object_config;
    // A directory stands in for a remote store (tests, a second disk): the
    // page cache is fine.
    o.local.direct_io = false;
    auto opened = storage::OpenBackend(opts_.object_url, o);
    if (!opened.ok()) return Named("object tier", opened.status());
    object_tier_ = std::move(*opened);
  }
  if (!opts_.shared_root.empty() && !storage::IsObjectUrl(opts_.shared_root)) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.shared_root, ec);
    if (ec)
      return Named("--shared-root " + opts_.shared_root,
                   absl::InternalError(ec.message()));
  }
  return absl::OkStatus();
}

// The same state machine and service as ckpt-coordinator, its state next to
// the catalog; the node agent dials it on loopback.
absl::Status Daemon::StartCoordinator() {
  if (opts_.coordinator_listen.empty()) return absl::OkStatus();
  coordinator::CoordinatorOptions co;
  coordinator_metrics_ = std::make_shared<coordinator::CoordinatorMetrics>();
  co.metrics = coordinator_metrics_;
  co.state_dir = opts_.root + "/.coordinator";
  co.shared_root = storage::IsObjectUrl(opts_.shared_root) ? opts_.shared_root
                                                           : opts_.storage.root;
  co.heartbeat_timeout = std::chrono::milliseconds(opts_.heartbeat_timeout_ms);
  co.object_config = opts_.object_config;
  auto c = coordinator::Coordinator::Open(co);
  if (!c.ok()) return Named("coordinator", c.status());
  auto server = coordinator::CoordinatorServer::Start(std::move(*c),
                                                      opts_.coordinator_listen);
  if (!server.ok()) return Named("coordinator", server.status());
  coordinator_ = std::move(*server);
  const std::string host =
      opts_.coordinator_listen.substr(0, opts_.coordinator_listen.rfind(':'));
  // A loopback host (options.cc allows no other).
  const std::string dial = host.rfind("127.", 0) == 0 ? host
                           : host == "localhost"      ? "127.0.0.1"
                                                      : "[::1]";
  opts_.agent.coordinator = dial + ":" + std::to_string(coordinator_->port());
  LogInfo("coordinator listening on " + host + ":" +
          std::to_string(coordinator_->port()));
  std::printf("coordinator listening on %s:%d\n", host.c_str(),
              coordinator_->port());
  std::fflush(stdout);
  return absl::OkStatus();
}

// Served before recovery starts, so a long re-attach is visible; the
// engine's gauges appear once it is open.
absl::Status Daemon::StartMetrics() {
  metrics_ = std::make_shared<DaemonMetrics>();
  opts_.engine.metrics = metrics_;
  replica_metrics_ = std::make_shared<ReplicaMetrics>();
  if (opts_.metrics_listen.empty()) return absl::OkStatus();
  std::vector<std::weak_ptr<prometheus::Collectable>> collected{
      metrics_, replica_metrics_};
  if (coordinator_metrics_) collected.push_back(coordinator_metrics_);
  auto started =
      MetricsServer::Start(opts_.metrics_listen, "--metrics-listen", collected);
  if (!started.ok()) return Named("metrics", started.status());
  metrics_server_ = std::move(*started);
  LogInfo("metrics on http://" + metrics_server_->address() + "/metrics");
  std::printf("metrics listening on %s\n", metrics_server_->address().c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// Before READY and before the node registers: the coordinator gives an
// unhealthy node no ranks (health.h).
void Daemon::CheckHealth() {
  notifier_.Status("running health checks");
  const auto health = RunHealthChecks(opts_.health);
  for (const auto& r : health) {
    const std::string line = "health " + HealthText({r});
    if (r.passed())
      LogInfo(line.substr(0, line.size() - 1));
    else
      LogWarning(line.substr(0, line.size() - 1));
  }
  opts_.agent.health_report = ToHealthProto(health);
  opts_.agent.health_check = [o = opts_.health] {
    return ToHealthProto(RunHealthChecks(o));
  };
}

// The agent, the replica store and the replicate stage exist before the
// engine, whose recovery already reports to them.
void Daemon::MakeNodeSide() {
  if (!opts_.cluster) return;
  opts_.agent.shm_prefix = opts_.engine.shm_prefix;  // beacons
  opts_.agent.huge_dir = opts_.engine.huge_dir;
  opts_.agent.replica_transport = opts_.replicas.transport;
  opts_.agent.replicas = this;
  // Beside the catalog, as private as it is: a restarted ckptd names its
  // previous life's epoch, and takes over from it at once.
  opts_.agent.epoch_file = opts_.root + "/.catalog/node-epoch";
  opts_.agent.on_heartbeat = [m = metrics_](bool relayed) {
    m->CoordinatorHeartbeat(relayed);
  };
  opts_.agent.on_relay_fallback = [m = metrics_] { m->RelayFallback(); };
  agent_ = std::make_unique<NodeAgent>(opts_.agent);
  if (opts_.replicas.port != 0)
    // Every copy dropped (replaced, or given up for room) is withdrawn: no
    // plan names a copy this node no longer holds.
    replica_store_ = std::make_unique<ReplicaStore>(
        opts_.replicas.memory_bytes,
        [a = agent_.get()](const replica::v1::ShardCopy& dropped) {
          a->Report(ReplicaWithdrawalOf(dropped));
        });
  if (opts_.replicas.send) {
    ReplicatorOptions ro;
    ro.node_id = opts_.agent.node_id;
    ro.tls = opts_.agent.tls;
    ro.bandwidth = opts_.replicas.bandwidth;
    ro.corrupt = corrupt_replicas_;
    ro.transport = opts_.replicas.transport;
    replicator_ = std::make_unique<Replicator>(std::move(ro));
    if (opts_.replicas.fixed_target)
      replicator_->SetTarget(opts_.replicas.fixed_target);
  }
  opts_.engine.on_shard = [this](const ShardReport& r) { OnShard(r); };
  opts_.engine.on_fallback = [a = agent_.get()](const FallbackReport& f) {
    a->ReportFallback(f);
  };
  opts_.engine.fetch_from_peers =
      [a = agent_.get()](const std::string& job, uint64_t step, uint32_t rank) {
        return a->FetchSavedRankFromPeers(job, step, rank);
      };
  opts_.engine.fetch_ranges_from_peers =
      [a = agent_.get()](const std::string& job, uint64_t step, uint32_t rank,
                         std::span<const ImageRange> ranges) {
        return a->FetchSavedRangesFromPeers(job, step, rank, ranges);
      };
  opts_.engine.step_index = [a = agent_.get()](const std::string& job,
                                               uint64_t step) {
    return a->StepIndex(job, step);
  };
}

absl::Status Daemon::OpenEngine() {
  auto engine =
      Engine::Open(opts_.engine, storage_, catalog_.get(), object_tier_.get());
  if (!engine.ok()) return Named("recovery", engine.status());
  engine_ = std::move(*engine);
  // Before the socket accepts saves: a save's Staged() is never missed.
  if (replicator_) replicator_->Start(engine_.get());
  return absl::OkStatus();
}

absl::Status Daemon::StartServing() {
  auto listener = PeerListener::Listen(opts_.socket_path, opts_.listener);
  if (!listener.ok()) return Named("socket", listener.status());
  listener_ = std::move(*listener);
  service_ = std::make_unique<CkptdService>(engine_.get(), listener_.get(),
                                            opts_.root);
  grpc::ServerBuilder builder;
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(opts_.max_request_mib << 20));
  builder.SetMaxSendMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (!server_)
    return Named("grpc", absl::InternalError("server did not start"));
  listener_->Start(server_.get());
  return absl::OkStatus();
}

absl::Status Daemon::StartReplicaServer() {
  if (!replica_store_) return absl::OkStatus();
  ReplicaServerOptions ro;
  ro.port = static_cast<int>(opts_.replicas.port);
  ro.bulk_port = static_cast<int>(opts_.replicas.bulk_port);
  ro.tls = opts_.agent.tls;
  ro.on_replicated = [a = agent_.get()](const HeldReplica& held) {
    a->Report(ReplicatedReportOf(held));
  };
  auto started =
      ReplicaServer::Start(std::move(ro), replica_store_.get(), engine_.get());
  if (!started.ok()) return Named("replicas", started.status());
  replica_server_ = std::move(*started);
  LogInfo("replica listener on port " +
          std::to_string(replica_server_->port()) + ", holding up to " +
          std::to_string(opts_.replicas.memory_bytes) + " bytes, bulk port " +
          std::to_string(replica_server_->bulk_port()));
  return absl::OkStatus();
}

void Daemon::ServeUntil(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  LogInfo(std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
          ", draining pending persists");
  watchdog_
      .reset();  // systemd's stop timeout (TimeoutStopSec=) bounds the drain
  notifier_.Stopping(
      "draining: " + std::to_string(engine_->Progress().persists_queued) +
      " persists queued");
  const size_t left = engine_->Drain(opts_.drain_deadline);
  if (fault_)
    fault_->ClearFaults();  // release the hung writes so the persister can stop
  if (left)
    LogWarning(
        std::to_string(left) +
        " shards not durable at the drain deadline; "
        "they stay in shared memory and a restarted ckptd persists them");
  listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

Daemon::~Daemon() {
  watchdog_.reset();
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  if (replica_metrics_) replica_metrics_->Detach();
  // Stopped before the engine whose slots it reads, destroyed after the
  // engine, whose persister may still call Staged().
  if (replicator_) replicator_->Stop();
  if (replica_server_) replica_server_->Shutdown();
  agent_.reset();  // before the engine it reports on
  replica_server_.reset();
  server_.reset();
  service_.reset();
  listener_.reset();
  engine_.reset();
  replicator_.reset();
  if (coordinator_) coordinator_->Shutdown();
  metrics_server_.reset();
}

void Daemon::OnShard(const ShardReport& r) {
  agent_->Report(r);
  if (replicator_ && !r.failed)
    replicator_->Staged(r.job, r.step, r.rank, r.durable);
}

void Daemon::SetTarget(std::optional<ReplicaPeer> target) {
  // A fixed --replica-target is kept whatever the coordinator names.
  if (replicator_ && !opts_.replicas.fixed_target)
    replicator_->SetTarget(std::move(target));
}

std::optional<HolderRefusal> Daemon::Refused() const {
  if (!replicator_ || opts_.replicas.fixed_target) return std::nullopt;
  return replicator_->Refused();
}

std::shared_ptr<const HeldReplica> Daemon::Held(const std::string& job,
                                                uint64_t step,
                                                uint32_t rank) const {
  return replica_store_ ? replica_store_->Find(job, step, rank) : nullptr;
}

void Daemon::Prefetched(const std::string& job, uint64_t step, uint32_t rank) {
  if (replicator_) replicator_->Staged(job, step, rank);
}

}  // namespace ckpt::daemon
