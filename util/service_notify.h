// Service manager notifications (systemd's sd_notify(3) protocol, through
// libsystemd): READY=1, STATUS=..., STOPPING=1 and WATCHDOG=1 on the
// datagram socket named by $NOTIFY_SOCKET. Without $NOTIFY_SOCKET (or in a
// build without libsystemd) every call does nothing.
//
// ServiceWatchdog is the one thread that pings the watchdog: every half of
// $WATCHDOG_USEC it asks the program whether its own threads still make
// progress (ProgressWatch tracks one counter each) and sends WATCHDOG=1 only
// while they do, so a wedged thread lets systemd's watchdog fire. It also
// refreshes STATUS= with what the program says it is doing.
//
// Thread-safety: ServiceNotifier's methods may be called from any thread;
// ProgressWatch is used by one thread; ServiceWatchdog owns its thread and
// joins it on destruction.
#ifndef CKPT_UTIL_SERVICE_NOTIFY_H_
#define CKPT_UTIL_SERVICE_NOTIFY_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace ckpt {

class ServiceNotifier {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC/$WATCHDOG_PID once.
  ServiceNotifier();

  // True when a service manager listens (and libsystemd was built in).
  bool enabled() const { return enabled_; }
  // The watchdog timeout systemd applies (WatchdogSec=), or 0 when none.
  std::chrono::microseconds watchdog_timeout() const { return watchdog_; }

  void Ready(std::string_view status) const;
  void Status(std::string_view status) const;
  void Stopping(std::string_view status) const;
  void WatchdogPing() const;

 private:
  void Send(const std::string& message) const;

  bool enabled_ = false;
  std::chrono::microseconds watchdog_{0};
};

// Whether one counter of a thread's progress still moves: healthy while the
// counter changed within `allowance` or the thread has nothing to do.
class ProgressWatch {
 public:
  explicit ProgressWatch(std::chrono::steady_clock::duration allowance)
      : allowance_(allowance) {}
  bool Healthy(uint64_t counter, bool has_work,
               std::chrono::steady_clock::time_point now);

 private:
  const std::chrono::steady_clock::duration allowance_;
  bool seen_ = false;
  uint64_t last_ = 0;
  std::chrono::steady_clock::time_point last_change_{};
};

// The program's answer to "are you well, and what are you doing".
struct ServiceHealth {
  bool healthy = true;
  std::string status;  // STATUS= text; when unhealthy, what is stuck
};

class ServiceWatchdog {
 public:
  // Starts the thread when the notifier is enabled: it calls check() every
  // half watchdog timeout (every status_period when there is no watchdog),
  // pings while healthy and sends STATUS= when the text changes.
  // notifier must outlive this.
  ServiceWatchdog(const ServiceNotifier* notifier,
                  std::chrono::milliseconds status_period,
                  std::function<ServiceHealth()> check);
  ~ServiceWatchdog();  // Stop()
  ServiceWatchdog(const ServiceWatchdog&) = delete;
  ServiceWatchdog& operator=(const ServiceWatchdog&) = delete;

  void Stop();

 private:
  void Loop(std::chrono::microseconds interval);

  const ServiceNotifier* const notifier_;
  const std::function<ServiceHealth()> check_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ckpt

#endif  // CKPT_UTIL_SERVICE_NOTIFY_H_
