// DaemonClock: the daemon's one source of time for the decisions it
// schedules — when a persist or upload retry is due (persister.h,
// uploader.h), the `now` a persist's outcome is recorded at — injected
// through EngineOptions::clock as the coordinator's is through
// CoordinatorOptions::now_ms. The real clock is steady_clock; a test
// passes a ManualClock and moves time itself, so a back-off is tested by
// advancing the clock, not by sleeping through it.
//
// A queue that waits for a task's time waits through the clock
// (WaitUntil): the real clock waits on the condition variable until the
// deadline, a ManualClock until notified or advanced past it.
//
// Thread-safety: every method is safe from any thread.
#ifndef CKPT_DAEMON_CORE_CLOCK_H_
#define CKPT_DAEMON_CORE_CLOCK_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::daemon {

class DaemonClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~DaemonClock() = default;
  virtual TimePoint Now() const = 0;
  // Waits on `cv` (`lock` held, released meanwhile) until notified or
  // until Now() reaches `deadline`; may return early (the caller checks
  // its condition again, as after any condition variable wait).
  virtual void WaitUntil(std::condition_variable& cv,
                         std::unique_lock<std::mutex>& lock,
                         TimePoint deadline) const = 0;
  // steady_clock; lives for the whole program.
  static const DaemonClock* Real();
};

// Time that moves only when Advance is called. A wait on it ends when its
// queue is notified, or when Advance reaches its deadline (Advance then
// notifies the queue with its mutex taken, so no wake-up is lost); the
// queues must outlive the Advance calls made while they wait.
class ManualClock : public DaemonClock {
 public:
  // Starts at an arbitrary fixed point, far from steady_clock's epoch.
  ManualClock() : now_(TimePoint{} + std::chrono::hours(1)) {}
  TimePoint Now() const override;
  void WaitUntil(std::condition_variable& cv,
                 std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override;
  void Advance(std::chrono::steady_clock::duration d);
  // Returns once a wait for `deadline` is in progress: a queue has seen
  // that its next task is due then and waits for that time.
  void AwaitWaitFor(TimePoint deadline) const;
  // Returns once a wait for a time after `t` is in progress (not one for a
  // notification only), and the earliest such time.
  TimePoint AwaitWaitAfter(TimePoint t) const;

 private:
  struct Waiter {
    uint64_t id;
    TimePoint deadline;
    std::condition_variable* cv;
    std::mutex* mu;
  };
  mutable absl::Mutex mu_;
  TimePoint now_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  mutable std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_CLOCK_H_
