// ckpt-coordinator: the coordinator of multi-node checkpointed jobs.
//   ckpt-coordinator --listen HOST:PORT --state
//   DIR|etcd://HOST:PORT[,...]/PREFIX
//                    [--shared-root DIR] [--heartbeat-timeout-ms N]
//                    (--tls-cert F --tls-key F --tls-ca F | --insecure)
//                    [--admin-identities ID,...] [--advertise-addr HOST:PORT]
//                    [--lease-ttl-s N] [--config FILE] [--metrics-listen
//                    HOST:PORT]
// Prints "listening on HOST:PORT" (with the real port when PORT is 0) on
// stdout once it serves; SIGTERM/SIGINT stop it (state is always durable,
// so SIGKILL loses nothing that was acknowledged). With etcd:// it stands by
// until it wins the leader election (etcd/election.h), then loads the state
// from etcd and leads; a leader that loses its lease, or finds a write
// refused by the fence, exits with status 3 at once (its supervisor restarts
// it as a standby).
//
// Under systemd (Type=notify) it says READY=1 once the state is loaded (a
// standby: once it listens) and the port listens, STOPPING=1 on SIGTERM,
// and pings the watchdog only while the failure detector's tick loop runs
// (a tick within the watchdog timeout, or within two tick periods when
// those are longer; a standby has no tick loop and is healthy).
//
// Test-only: CKPT_COORDINATOR_TEST_FAULT=hold-global-manifest:PATH makes the
// first MANIFEST.global write of the process that finds PATH there (and
// creates PATH.taken first: one process of several) wait until PATH is
// removed: a leader paused in the middle of its manifest write
// (tests/ha_test.cc).
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "coordinator/etcd/election.h"
#include "coordinator/etcd/etcd_kv.h"
#include "coordinator/options.h"
#include "coordinator/service.h"
#include "util/metrics_server.h"
#include "util/program.h"
#include "util/service_notify.h"

namespace {

namespace co = ckpt::coordinator;

// See CKPT_COORDINATOR_TEST_FAULT above.
class HeldGlobalManifest : public ckpt::storage::BackendWrapper {
 public:
  HeldGlobalManifest(std::unique_ptr<ckpt::storage::Backend> base,
                     std::string path)
      : BackendWrapper(base.get()),
        base_(std::move(base)),
        path_(std::move(path)) {}
  absl::Status PutSmallObject(std::string_view key,
                              std::string_view contents) override {
    if (key.find("MANIFEST.global") != std::string_view::npos &&
        access(path_.c_str(), F_OK) == 0) {
      int fd = open((path_ + ".taken").c_str(),
                    O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
      if (fd >= 0) {
        close(fd);
        std::fprintf(stderr,
                     "ckpt-coordinator: TEST-ONLY FAULT: holding the write of "
                     "%.*s until %s is gone\n",
                     static_cast<int>(key.size()), key.data(), path_.c_str());
        while (access(path_.c_str(), F_OK) == 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    absl::Status s = target()->PutSmallObject(key, contents);
    if (key.find("MANIFEST.global") != std::string_view::npos)
      std::fprintf(stderr,
                   "ckpt-coordinator: TEST-ONLY FAULT: wrote %.*s: %s\n",
                   static_cast<int>(key.size()), key.data(),
                   s.ok() ? "OK" : std::string(s.message()).c_str());
    return s;
  }

 private:
  std::unique_ptr<ckpt::storage::Backend> base_;
  const std::string path_;
};

[[noreturn]] void Deposed(const std::string& why) {
  std::fprintf(stderr,
               "ckpt-coordinator: lost leadership: %s; exiting (a supervisor "
               "restarts it as a standby)\n",
               why.c_str());
  std::fflush(stderr);
  std::_Exit(3);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ckpt-coordinator: %s\n",
               std::string(s.message()).c_str());
  return 1;
}

void PrintListening(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
}

// Starts the server as a standby and the election (not yet campaigning).
absl::StatusOr<std::unique_ptr<co::CoordinatorServer>> StartHa(
    const co::CoordinatorServerOptions& opts,
    std::shared_ptr<co::etcd::EtcdClient>* client, std::string* prefix,
    std::unique_ptr<co::etcd::LeaderElection>* election) {
  auto state = co::etcd::ParseEtcdState(opts.etcd_state, "--state");
  if (!state.ok()) return state.status();
  *client = std::make_shared<co::etcd::EtcdClient>(
      state->endpoints, std::chrono::seconds(2), opts.etcd_credentials);
  *prefix = state->prefix;
  auto election_slot =
      std::make_shared<std::atomic<co::etcd::LeaderElection*>>(nullptr);
  co::Leadership leadership;
  leadership.leading = [election_slot] {
    co::etcd::LeaderElection* e = election_slot->load();
    return e != nullptr && e->leading();
  };
  leadership.leader = [election_slot] {
    co::etcd::LeaderElection* e = election_slot->load();
    return e ? e->leader() : std::string();
  };
  auto server = co::CoordinatorServer::StartStandby(opts.listen, opts.security,
                                                    leadership);
  if (!server.ok()) return server.status();
  co::etcd::ElectionOptions eo;
  eo.key = state->prefix + "leader";
  eo.advertise = opts.advertise.empty()
                     ? opts.listen.substr(0, opts.listen.rfind(':')) + ":" +
                           std::to_string((*server)->port())
                     : opts.advertise;
  eo.ttl_s = opts.lease_ttl_s;
  *election = std::make_unique<co::etcd::LeaderElection>(*client, eo);
  election_slot->store(election->get());
  return server;
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckpt-coordinator", CKPT_VERSION))
    return 0;
  // The system's Abseil is built with its debug checks: every Mutex lock
  // (the state lock once per heartbeat) walked a lock-order graph, 3.5%
  // of the coordinator's CPU at 1,024 nodes. Tests keep the check.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // glibc gives a burst's memory back (a large block by munmap, the heap's
  // top by trimming past 128 KiB) and faults it in again for the next:
  // the page faults and sysmalloc were ~5% of the coordinator's CPU
  // behind relays. It keeps what it had: its state is resident anyway.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // gRPC's threads must not take SIGTERM: the waiter thread does.
  const sigset_t sigs = ckpt::BlockSignals({SIGTERM, SIGINT});
  // A connection per node calling it directly, and per relay.
  (void)ckpt::RaiseDescriptorLimit();
  std::string help;
  auto opts = co::ParseCoordinatorOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::printf("%s", help.c_str());
      return 0;
    }
    std::fprintf(stderr, "ckpt-coordinator: %s\n",
                 std::string(opts.status().message()).c_str());
    return 2;
  }
  const ckpt::ServiceNotifier notifier;
  notifier.Status(opts->etcd_state.empty()
                      ? "loading state from " + opts->coordinator.state_dir
                      : "joining the leader election on " + opts->etcd_state);

  auto metrics = std::make_shared<co::CoordinatorMetrics>();
  opts->coordinator.metrics = metrics;
  if (const char* f = std::getenv("CKPT_COORDINATOR_TEST_FAULT");
      f != nullptr && f[0] != '\0') {
    constexpr std::string_view kHold = "hold-global-manifest:";
    if (std::string_view(f).rfind(kHold, 0) != 0 ||
        std::strlen(f) == kHold.size()) {
      std::fprintf(stderr,
                   "ckpt-coordinator: CKPT_COORDINATOR_TEST_FAULT: only \"%s "
                   "PATH\" is known (test-only)\n",
                   std::string(kHold).c_str());
      return 2;
    }
    std::string path(f + kHold.size());
    opts->coordinator.wrap_shared_root =
        [path](std::unique_ptr<ckpt::storage::Backend> b) {
          return std::unique_ptr<ckpt::storage::Backend>(
              std::make_unique<HeldGlobalManifest>(std::move(b), path));
        };
    std::fprintf(stderr, "ckpt-coordinator: TEST-ONLY FAULT: %s\n", f);
  }
  std::unique_ptr<ckpt::MetricsServer> metrics_server;
  if (!opts->metrics_listen.empty()) {
    auto started = ckpt::MetricsServer::Start(opts->metrics_listen,
                                              "--metrics-listen", {metrics});
    if (!started.ok()) return Fail(started.status());
    metrics_server = std::move(*started);
  }
  std::unique_ptr<co::etcd::LeaderElection>
      election;  // outlives the server (its Leadership asks it)
  std::unique_ptr<co::CoordinatorServer> server;
  std::shared_ptr<co::etcd::EtcdClient> etcd_client;
  std::string etcd_prefix;
  if (!opts->etcd_state.empty()) {
    auto started = StartHa(*opts, &etcd_client, &etcd_prefix, &election);
    if (!started.ok()) return Fail(started.status());
    server = std::move(*started);
  } else {
    auto coord = co::Coordinator::Open(opts->coordinator);
    if (!coord.ok()) return Fail(coord.status());
    auto started = co::CoordinatorServer::Start(std::move(*coord), opts->listen,
                                                opts->security);
    if (!started.ok()) return Fail(started.status());
    server = std::move(*started);
  }
  PrintListening(opts->listen, server->port());
  if (metrics_server) {
    std::printf("metrics listening on %s\n", metrics_server->address().c_str());
    std::fflush(stdout);
  }
  const std::string host = opts->listen.substr(0, opts->listen.rfind(':'));
  const std::string serving =
      "serving on " + host + ":" + std::to_string(server->port());
  notifier.Ready(election ? "standing by on " + host + ":" +
                                std::to_string(server->port())
                          : serving);
  std::unique_ptr<ckpt::ServiceWatchdog> watchdog;
  if (notifier.enabled()) {
    std::chrono::steady_clock::duration allowance =
        std::max<std::chrono::steady_clock::duration>(
            notifier.watchdog_timeout(), 2 * server->tick_period());
    auto ticks = std::make_shared<ckpt::ProgressWatch>(allowance);
    co::CoordinatorServer* s = server.get();
    watchdog = std::make_unique<ckpt::ServiceWatchdog>(
        &notifier, std::chrono::seconds(2), [=] {
          ckpt::ServiceHealth h;
          const bool leading = s->promoted();
          h.healthy = ticks->Healthy(s->ticks(), /*has_work=*/leading,
                                     std::chrono::steady_clock::now());
          h.status = !h.healthy ? "stuck: the failure detector made no progress"
                     : leading  ? serving
                                : "standing by (not the leader)";
          return h;
        });
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    watchdog.reset();
    notifier.Stopping("stopping");
    if (election) election->Stop();
    server->Shutdown();
  });
  if (election) {
    // Campaign returns when this replica leads, or with an error once Stop()
    // ran (a signal while standing by).
    absl::StatusOr<co::etcd::Fence> fence = election->Campaign();
    if (fence.ok()) {
      auto kv = co::etcd::NewEtcdKv(etcd_client, etcd_prefix, *fence, Deposed);
      opts->coordinator.fence = static_cast<uint64_t>(fence->create_revision);
      opts->coordinator.leading = [e = election.get()] { return e->leading(); };
      auto coord = co::Coordinator::Open(opts->coordinator, std::move(kv));
      if (!coord.ok())
        Deposed("cannot load the state from etcd: " +
                std::string(coord.status().message()));
      election->KeepLeading(Deposed);
      server->Promote(std::move(*coord));
      notifier.Status(serving);
    }
  }
  server->Wait();  // only the waiter shuts the server down
  waiter.join();
  return 0;
}
