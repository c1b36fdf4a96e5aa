// ckptd's systemd watchdog: what it reports and when it stops pinging.
// The engine's reaper must tick (it takes the engine mutex every 100 ms:
// a deadlocked mutex stops it) and a running persist must advance (a task
// done or a piece of a shard written) within the watchdog timeout; while
// either is stuck, WATCHDOG=1 is not sent and systemd restarts ckptd after
// WatchdogSec=. STATUS= says how many persists are queued, or what is stuck.
// Thread-safety: the returned watchdog owns its thread; engine and notifier
// must outlive it.
#ifndef CKPT_DAEMON_WATCHDOG_H_
#define CKPT_DAEMON_WATCHDOG_H_

#include <memory>
#include <string>

#include "daemon/engine/engine.h"
#include "util/service_notify.h"

namespace ckpt::daemon {

// "serving; N persists queued (one running)".
std::string ServingStatus(const EngineProgress& p);

// Null when no service manager listens.
std::unique_ptr<ServiceWatchdog> StartEngineWatchdog(
    const ServiceNotifier* notifier, const Engine* engine);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_WATCHDOG_H_
