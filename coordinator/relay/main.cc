// ckpt-relay: carries a rack's heartbeats and shard reports to
// ckpt-coordinator in batches (relay.h; doc/operations.md "Relays").
//   ckpt-relay --listen HOST:PORT --coordinator HOST:PORT[,HOST:PORT...]
//              (--tls-cert F --tls-key F --tls-ca F | --insecure)
//              [--relay-id ID] [--gather-ms N] [--max-batch N]
//              [--max-in-flight N] [--metrics-listen HOST:PORT]
// Prints "listening on HOST:PORT" (the real port when PORT is 0) on stdout
// once it serves, and under systemd then says READY=1 (util/service_notify.h;
// WATCHDOG=1 only while the calls it gathered get answered); SIGTERM/SIGINT
// stop it (STOPPING=1). It keeps no state: a relay
// SIGKILLed loses nothing its nodes do not send again (they go to the
// coordinator directly meanwhile).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/relay/relay.h"
#include "util/metrics_server.h"
#include "util/program.h"
#include "util/service_notify.h"

namespace {

namespace co = ckpt::coordinator;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ckpt-relay: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckpt-relay", CKPT_VERSION)) return 0;
  // gRPC's threads must not take SIGTERM: the waiter thread does.
  const sigset_t sigs = ckpt::BlockSignals({SIGTERM, SIGINT});
  // A connection per node of its rack.
  (void)ckpt::RaiseDescriptorLimit();
  std::string help;
  auto opts = co::ParseRelayOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::printf("%s", help.c_str());
      return 0;
    }
    std::fprintf(stderr, "ckpt-relay: %s\n",
                 std::string(opts.status().message()).c_str());
    return 2;
  }
  auto metrics = std::make_shared<co::RelayMetrics>();
  std::unique_ptr<ckpt::MetricsServer> metrics_server;
  if (!opts->metrics_listen.empty()) {
    auto started = ckpt::MetricsServer::Start(
        opts->metrics_listen, "--metrics-listen", {metrics->registry()});
    if (!started.ok()) return Fail(started.status());
    metrics_server = std::move(*started);
  }
  auto relay = co::Relay::Start(*opts, metrics);
  if (!relay.ok()) return Fail(relay.status());
  const std::string host = opts->listen.substr(0, opts->listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), (*relay)->port());
  if (metrics_server)
    std::printf("metrics listening on %s\n", metrics_server->address().c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "ckpt-relay %s: relaying to %s\n",
               opts->relay_id.c_str(), opts->coordinator.c_str());
  const ckpt::ServiceNotifier notifier;
  const std::string serving = absl::StrCat(
      "relaying ", host, ":", (*relay)->port(), " to ", opts->coordinator);
  notifier.Ready(serving);
  std::unique_ptr<ckpt::ServiceWatchdog> watchdog;
  if (notifier.enabled()) {
    // Pings while the gathered calls get answered: nothing waits, or a
    // batch came back (or gave up) within the watchdog timeout, or within
    // the longest a batch may take when that is longer. A wedged relay
    // answers nothing; its nodes time out on it once per backoff.
    const std::chrono::steady_clock::duration allowance =
        std::max<std::chrono::steady_clock::duration>(
            notifier.watchdog_timeout(), (*relay)->longest_send());
    auto answers = std::make_shared<ckpt::ProgressWatch>(allowance);
    const co::Relay* r = relay->get();
    watchdog = std::make_unique<ckpt::ServiceWatchdog>(
        &notifier, std::chrono::seconds(2), [=] {
          const co::Relay::Progress p = r->progress();
          ckpt::ServiceHealth h;
          h.healthy = answers->Healthy(p.answered, p.gathered != p.answered,
                                       std::chrono::steady_clock::now());
          h.status =
              !h.healthy ? absl::StrCat("stuck: ", p.gathered - p.answered,
                                        " node calls wait, no batch came back")
              : r->coordinator_answers()
                  ? serving
                  : serving + " (it does not answer: the nodes go directly)";
          return h;
        });
  }
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    watchdog.reset();
    notifier.Stopping("stopping");
    (*relay)->Shutdown();
  });
  (*relay)->Wait();
  waiter.join();
  return 0;
}
