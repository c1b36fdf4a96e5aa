// TakeDueTask: the one scheduling step of the daemon's delayed task queues
// (persister.h, uploader.h): each task carries a `not_before` time (a retry
// waits out its back-off) and the first due task in queue order runs next
// (or the first one the caller's `claim` takes).
// The caller holds `lock` (the queue's mutex) and owns the queue; this only
// picks, or sleeps on `cv` until the earliest task is due (or a Push/Stop
// notifies). Not thread-safe by itself: it relies on the caller's lock.
#ifndef CKPT_DAEMON_CORE_DUE_TASK_H_
#define CKPT_DAEMON_CORE_DUE_TASK_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "daemon/core/clock.h"

namespace ckpt::daemon {

// Removes and returns the first task whose not_before has come and that
// `claim` takes: claim(task, due) is called for the tasks in queue order
// until one is taken, and may remember the ones it refuses (a task that
// must wait for an earlier one). When none is taken, waits (until the
// earliest not_before by `clock`, or a notification) and returns nullopt:
// the caller checks its stop flag and calls again.
template <typename Task, typename Claim>
std::optional<Task> TakeDueTask(const DaemonClock& clock,
                                std::deque<Task>& tasks,
                                std::condition_variable& cv,
                                std::unique_lock<std::mutex>& lock,
                                Claim claim) {
  const DaemonClock::TimePoint now = clock.Now();
  DaemonClock::TimePoint earliest = DaemonClock::TimePoint::max();
  for (auto it = tasks.begin(); it != tasks.end(); ++it) {
    const bool due = it->not_before <= now;
    if (claim(*it, due)) {
      Task task = std::move(*it);
      tasks.erase(it);
      return task;
    }
    if (!due) earliest = std::min(earliest, it->not_before);
  }
  clock.WaitUntil(cv, lock, earliest);
  return std::nullopt;
}

// The first due task in queue order.
template <typename Task>
std::optional<Task> TakeDueTask(const DaemonClock& clock,
                                std::deque<Task>& tasks,
                                std::condition_variable& cv,
                                std::unique_lock<std::mutex>& lock) {
  return TakeDueTask(clock, tasks, cv, lock,
                     [](const Task&, bool due) { return due; });
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_DUE_TASK_H_
