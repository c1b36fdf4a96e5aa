// The real and the manual clock. See clock.h.
#include "daemon/core/clock.h"

#include <algorithm>

namespace ckpt::daemon {
namespace {

class SteadyClock : public DaemonClock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  void WaitUntil(std::condition_variable& cv,
                 std::unique_lock<std::mutex>& lock,
                 TimePoint deadline) const override {
    if (deadline == TimePoint::max())
      cv.wait(lock);
    else
      cv.wait_until(lock, deadline);
  }
};

}  // namespace

const DaemonClock* DaemonClock::Real() {
  static const SteadyClock* const real = new SteadyClock;
  return real;
}

DaemonClock::TimePoint ManualClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

void ManualClock::WaitUntil(std::condition_variable& cv,
                            std::unique_lock<std::mutex>& lock,
                            TimePoint deadline) const {
  uint64_t id;
  {
    // Registered with the check: an Advance after it wakes this wait, one
    // before it is seen here.
    absl::MutexLock l(&mu_);
    if (now_ >= deadline) return;
    id = next_id_++;
    waiters_.push_back({id, deadline, &cv, lock.mutex()});
  }
  // Advance takes `lock`'s mutex before it notifies, so its notification
  // cannot fall between the registration and this wait.
  cv.wait(lock);
  absl::MutexLock l(&mu_);  // gone already when Advance woke it
  std::erase_if(waiters_, [&](const Waiter& w) { return w.id == id; });
}

void ManualClock::Advance(std::chrono::steady_clock::duration d) {
  std::vector<Waiter> due;
  {
    absl::MutexLock l(&mu_);
    now_ += d;
    const TimePoint now = now_;
    for (const Waiter& w : waiters_)
      if (w.deadline <= now) due.push_back(w);
    std::erase_if(waiters_,
                  [now](const Waiter& w) { return w.deadline <= now; });
  }
  // Without the clock's lock: a waiter takes it with its queue's held.
  for (const Waiter& w : due) {
    std::lock_guard<std::mutex> queue(*w.mu);
    w.cv->notify_all();
  }
}

void ManualClock::AwaitWaitFor(TimePoint deadline) const {
  absl::MutexLock l(&mu_);
  struct Arg {
    const std::vector<Waiter>* waiters;
    TimePoint deadline;
  } arg{&waiters_, deadline};
  mu_.Await(absl::Condition(
      +[](Arg* a) {
        return std::any_of(
            a->waiters->begin(), a->waiters->end(),
            [&](const Waiter& w) { return w.deadline == a->deadline; });
      },
      &arg));
}

DaemonClock::TimePoint ManualClock::AwaitWaitAfter(TimePoint t) const {
  // A timed wait: not one for a notification only (deadline max).
  auto timed = [](const Waiter& w, TimePoint after) {
    return w.deadline > after && w.deadline != TimePoint::max();
  };
  absl::MutexLock l(&mu_);
  struct Arg {
    const std::vector<Waiter>* waiters;
    TimePoint after;
  } arg{&waiters_, t};
  mu_.Await(absl::Condition(
      +[](Arg* a) {
        return std::any_of(
            a->waiters->begin(), a->waiters->end(), [&](const Waiter& w) {
              return w.deadline > a->after && w.deadline != TimePoint::max();
            });
      },
      &arg));
  TimePoint earliest = TimePoint::max();
  for (const Waiter& w : waiters_)
    if (timed(w, t)) earliest = std::min(earliest, w.deadline);
  return earliest;
}

}  // namespace ckpt::daemon
