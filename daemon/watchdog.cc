// See watchdog.h.
#include "daemon/watchdog.h"

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

std::string ServingStatus(const EngineProgress& p) {
  return absl::StrCat("serving; ", p.persists_queued, " persists queued",
                      p.persist_running ? " (one running)" : "");
}

std::unique_ptr<ServiceWatchdog> StartEngineWatchdog(
    const ServiceNotifier* notifier, const Engine* engine) {
  if (!notifier->enabled()) return nullptr;
  // Without a watchdog only STATUS= is refreshed, and nothing counts as stuck.
  std::chrono::steady_clock::duration allowance = notifier->watchdog_timeout();
  if (allowance.count() == 0) allowance = std::chrono::hours(24 * 365);
  auto reaper = std::make_shared<ProgressWatch>(allowance);
  auto persister = std::make_shared<ProgressWatch>(allowance);
  return std::make_unique<ServiceWatchdog>(
      notifier, std::chrono::seconds(2), [engine, reaper, persister] {
        const EngineProgress p = engine->Progress();
        const auto now = std::chrono::steady_clock::now();
        ServiceHealth h;
        if (!reaper->Healthy(p.reaper_ticks, /*has_work=*/true, now)) {
          h.healthy = false;
          h.status =
              "stuck: the engine's reaper made no progress (engine mutex "
              "held?)";
        } else if (!persister->Healthy(p.persist_progress, p.persist_running,
                                       now)) {
          h.healthy = false;
          h.status =
              absl::StrCat("stuck: a persist made no progress; ",
                           p.persists_queued, " persists queued behind it");
        } else {
          h.status = ServingStatus(p);
        }
        return h;
      });
}

}  // namespace ckpt::daemon
