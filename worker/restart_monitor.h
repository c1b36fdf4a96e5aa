// RestartMonitor: the thread of an in-process restart in ckpt-worker. It
// watches the launcher's directory ($CKPT_RESTART_DIR, inotify) and reads
// the plan (through libckpt's PollRestart) whenever a file is renamed in
// or written there, so a new plan is seen as the launcher renames it in,
// not at a poll; re-read every max(`period`, 1 s) as a safety net, and
// every `period` where the directory cannot be watched (logged once).
// When a plan of a newer generation is there it raises the flag the
// trainer checks before each step, and breaks the connection the main
// thread is using (Watch), so that a rendezvous or collective blocked on a
// peer that may be dead returns at once instead of waiting for it. The
// main thread then takes the plan (TakePlan), joins its generation and
// trains on in the same process. A plan that cannot be read is reported
// once per distinct error and read again at the next change (the launcher
// replaces it whole). Thread-safe.
#ifndef CKPT_WORKER_RESTART_MONITOR_H_
#define CKPT_WORKER_RESTART_MONITOR_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/client.h"
#include "worker/data_parallel.h"

namespace ckpt::worker {

class RestartMonitor {
 public:
  // Watches for plans of generations above `generation` in `dir` (the
  // process's $CKPT_RESTART_DIR); notes go to `log`.
  RestartMonitor(std::string dir, uint64_t generation,
                 std::chrono::milliseconds period, std::FILE* log);
  ~RestartMonitor();  // stops and joins the thread
  RestartMonitor(const RestartMonitor&) = delete;
  RestartMonitor& operator=(const RestartMonitor&) = delete;

  // Set while a newer plan waits to be taken.
  const std::atomic<bool>* requested() const { return &requested_; }
  // The connection a newer plan breaks (null: none). Aborted at once if a
  // plan is already waiting. `comm` must stay alive until Watch(nullptr).
  void Watch(DataParallel* comm);
  // Blocks until a plan newer than the current generation is there; it
  // becomes the current one. Returns the newest.
  RestartPlan TakePlan();

 private:
  void Loop();
  // Blocks until the directory changes, the period passes or the
  // destructor wakes it. Without mu_.
  void WaitForChange();
  uint64_t LatestLocked() const {
    return newest_.has_value() ? newest_->generation : current_;
  }

  const std::string dir_;
  const std::chrono::milliseconds period_;
  std::FILE* const log_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t current_;
  std::optional<RestartPlan> newest_;
  DataParallel* comm_ = nullptr;
  bool stopping_ = false;
  std::string last_error_;
  std::atomic<bool> requested_{false};
  int notify_fd_ = -1;  // inotify on dir_; -1: polled every period_
  int wake_fd_ = -1;    // eventfd: the destructor wakes the loop
  std::thread thread_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_RESTART_MONITOR_H_
