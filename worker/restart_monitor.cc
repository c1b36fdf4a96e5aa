#include "worker/restart_monitor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/phase_trace.h"

namespace ckpt::worker {

namespace {

// With the directory watched, a re-read this often is only a safety net
// (a lost or overflowed notification); the plan comes by its event.
constexpr std::chrono::milliseconds kWatchedReread{1000};

}  // namespace

RestartMonitor::RestartMonitor(std::string dir, uint64_t generation,
                               std::chrono::milliseconds period, std::FILE* log)
    : dir_(std::move(dir)), period_(period), log_(log), current_(generation) {
  // Watched before the first read: a plan renamed in after that read is
  // an event the loop sees.
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ >= 0 && !dir_.empty()) {
    notify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (notify_fd_ >= 0 &&
        inotify_add_watch(notify_fd_, dir_.c_str(),
                          IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
      close(notify_fd_);
      notify_fd_ = -1;
    }
  }
  if (notify_fd_ < 0) {
    const std::string why =
        dir_.empty() ? std::string("no directory") : std::strerror(errno);
    std::fprintf(log_,
                 "in-process restart: cannot watch %s (%s): polling the plan "
                 "every %lld ms\n",
                 dir_.empty() ? "$CKPT_RESTART_DIR" : dir_.c_str(), why.c_str(),
                 static_cast<long long>(period_.count()));
    std::fflush(log_);
  }
  thread_ = std::thread([this] { Loop(); });
}

RestartMonitor::~RestartMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
  }
  thread_.join();
  if (notify_fd_ >= 0) close(notify_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void RestartMonitor::Watch(DataParallel* comm) {
  std::lock_guard<std::mutex> lock(mu_);
  comm_ = comm;
  if (comm_ != nullptr && newest_.has_value()) {
    comm_->Abort(absl::StrCat("generation ", newest_->generation,
                              " planned: in-process restart"));
  }
}

RestartPlan RestartMonitor::TakePlan() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return newest_.has_value(); });
  RestartPlan plan = *std::move(newest_);
  newest_.reset();
  current_ = plan.generation;
  requested_ = false;
  return plan;
}

void RestartMonitor::WaitForChange() {
  if (notify_fd_ < 0 && wake_fd_ < 0) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, period_, [&] { return stopping_; });
    return;
  }
  const std::chrono::milliseconds wait =
      notify_fd_ >= 0 ? std::max(period_, kWatchedReread) : period_;
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {notify_fd_, POLLIN, 0}};
  const int n =
      poll(fds, notify_fd_ >= 0 ? 2 : 1,
           static_cast<int>(std::min<int64_t>(wait.count(), INT_MAX)));
  if (n <= 0 || notify_fd_ < 0) return;  // the period, or stopping
  // Drained before the plan is read again: a plan renamed in after this
  // read is a new event.
  alignas(inotify_event) char buf[4096];
  while (read(notify_fd_, buf, sizeof(buf)) > 0) {
  }
}

void RestartMonitor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const uint64_t after = LatestLocked();
    lock.unlock();
    // A file read: not under the lock TakePlan and Watch need.
    absl::StatusOr<std::optional<RestartPlan>> plan = PollRestart(after);
    lock.lock();
    if (!plan.ok()) {
      if (std::string e = plan.status().ToString(); e != last_error_) {
        last_error_ = e;
        std::fprintf(log_, "in-process restart: reading the plan: %s\n",
                     e.c_str());
        std::fflush(log_);
      }
    } else if (plan->has_value() && (*plan)->generation > LatestLocked()) {
      last_error_.clear();
      newest_ = **plan;
      requested_ = true;
      Phase("plan_seen", -1);
      std::fprintf(log_, "generation %llu: restart requested\n",
                   static_cast<unsigned long long>(newest_->generation));
      std::fflush(log_);
      if (comm_ != nullptr) {
        comm_->Abort(absl::StrCat("generation ", newest_->generation,
                                  " planned: in-process restart"));
      }
      Phase("aborted", -1);
      cv_.notify_all();
    }
    if (stopping_) break;
    lock.unlock();
    WaitForChange();  // the directory's event, the period, or stopping
    lock.lock();
  }
}

}  // namespace ckpt::worker
