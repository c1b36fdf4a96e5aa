// sd_notify wrapper and the watchdog thread. See service_notify.h.
#include "util/service_notify.h"

#include <cstdio>
#include <cstdlib>

#ifdef CKPT_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace ckpt {

ServiceNotifier::ServiceNotifier() {
#ifdef CKPT_HAVE_SYSTEMD
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && socket[0] != '\0';
  uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC parses and WATCHDOG_PID (if set) is us.
  if (enabled_ && sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0)
    watchdog_ = std::chrono::microseconds(usec);
#endif
}

void ServiceNotifier::Send(const std::string& message) const {
#ifdef CKPT_HAVE_SYSTEMD
  if (!enabled_) return;
  int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r < 0) std::fprintf(stderr, "sd_notify: error %d\n", -r);  // best effort
#else
  (void)message;
#endif
}

namespace {

// STATUS= ends at a newline: one line only.
std::string OneLine(std::string_view s) {
  std::string out(s.substr(0, 400));
  for (char& c : out)
    if (c == '\n' || c == '\r') c = ' ';
  return out;
}

}  // namespace

void ServiceNotifier::Ready(std::string_view status) const {
  Send("READY=1\nSTATUS=" + OneLine(status));
}
void ServiceNotifier::Status(std::string_view status) const {
  Send("STATUS=" + OneLine(status));
}
void ServiceNotifier::Stopping(std::string_view status) const {
  Send("STOPPING=1\nSTATUS=" + OneLine(status));
}
void ServiceNotifier::WatchdogPing() const { Send("WATCHDOG=1"); }

bool ProgressWatch::Healthy(uint64_t counter, bool has_work,
                            std::chrono::steady_clock::time_point now) {
  if (!seen_ || counter != last_ || !has_work) {
    seen_ = true;
    last_ = counter;
    last_change_ = now;
    return true;
  }
  return now - last_change_ < allowance_;
}

ServiceWatchdog::ServiceWatchdog(const ServiceNotifier* notifier,
                                 std::chrono::milliseconds status_period,
                                 std::function<ServiceHealth()> check)
    : notifier_(notifier), check_(std::move(check)) {
  if (!notifier_->enabled()) return;
  std::chrono::microseconds interval =
      notifier_->watchdog_timeout().count() > 0
          ? notifier_->watchdog_timeout() / 2
          : std::chrono::microseconds(status_period);
  thread_ = std::thread([this, interval] { Loop(interval); });
}

ServiceWatchdog::~ServiceWatchdog() { Stop(); }

void ServiceWatchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ServiceWatchdog::Loop(std::chrono::microseconds interval) {
  const bool watchdog = notifier_->watchdog_timeout().count() > 0;
  std::string last_status;
  bool was_healthy = true;
  std::unique_lock<std::mutex> lock(mu_);
  do {
    lock.unlock();
    ServiceHealth h = check_();
    if (h.healthy && watchdog) notifier_->WatchdogPing();
    if (h.healthy != was_healthy)
      std::fprintf(stderr, "%s: %s\n",
                   h.healthy ? "watchdog: progress again"
                             : "watchdog: stalled, not pinging",
                   h.status.c_str());
    was_healthy = h.healthy;
    if (h.status != last_status) notifier_->Status(h.status);
    last_status = std::move(h.status);
    lock.lock();
  } while (!cv_.wait_for(lock, interval, [this] { return stopping_; }));
}

}  // namespace ckpt
