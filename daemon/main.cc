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
// probes (daemon/agent/net_probe.h); CKPTD_TEST_FAULT=hang-persist-writes makes
// every storage write hang (storage/fault_backend.h) until shutdown, to wedge
// the persister; CKPTD_TEST_FAULT=hang-prefetch makes every PREFETCH order hang
// unacknowledged (a replacement wedged on its shared root);
// CKPTD_TEST_FAULT=corrupt-replica-sends flips a byte of every
// replica chunk this node sends (on the wire, never in the slot).
#include <signal.h>

#include <cstdio>
#include <cstdlib>

#include "daemon/core/engine_util.h"
#include "daemon/daemon.h"
#include "daemon/health/health.h"
#include "daemon/options.h"
#include "util/program.h"

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "ckptd: %s%s%s\n", what.c_str(),
               what.empty() ? "" : ": ", std::string(s.message()).c_str());
  return 1;
}

// --health-check: runs the node's checks, prints them and exits non-zero
// naming each failed one; nothing is started.
[[noreturn]] void CheckHealthAndExit(const ckpt::daemon::DaemonOptions& opts) {
  using namespace ckpt::daemon;
  const auto results = RunHealthChecks(opts.health);
  std::string failed;
  for (const auto& r : results)
    if (!r.passed()) failed += (failed.empty() ? "" : ", ") + r.name;
  std::fputs(opts.health_json ? (HealthJson(results) + "\n").c_str()
                              : HealthText(results).c_str(),
             stdout);
  if (!failed.empty())
    std::fprintf(stderr, "ckptd: health check failed: %s\n", failed.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // Without static destructors: a timed-out check's thread may still run.
  std::_Exit(failed.empty() ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::daemon;
  using ckpt::LogInfo;
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
  if (opts->health_check) CheckHealthAndExit(*opts);
  auto daemon = Daemon::Start(std::move(*opts));
  if (!daemon.ok()) return Fail("", daemon.status());
  (*daemon)->ServeUntil(sigs);
  daemon->reset();
  LogInfo("stopped");
  return 0;
}
