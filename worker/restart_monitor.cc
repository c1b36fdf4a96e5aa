#include "worker/restart_monitor.h"

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

RestartMonitor::RestartMonitor(uint64_t generation,
                               std::chrono::milliseconds period, std::FILE* log)
    : period_(period), log_(log), current_(generation) {
  thread_ = std::thread([this] { Loop(); });
}

RestartMonitor::~RestartMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
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
      std::fprintf(log_, "generation %llu: restart requested\n",
                   static_cast<unsigned long long>(newest_->generation));
      std::fflush(log_);
      if (comm_ != nullptr) {
        comm_->Abort(absl::StrCat("generation ", newest_->generation,
                                  " planned: in-process restart"));
      }
      cv_.notify_all();
    }
    cv_.wait_for(lock, period_, [&] { return stopping_; });
  }
}

}  // namespace ckpt::worker
