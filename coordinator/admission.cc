#include "coordinator/admission.h"

#include <algorithm>

#include "util/retry.h"

namespace ckpt::coordinator {

KindQueue::KindQueue(std::string kind, int workers, int capacity,
                     int base_retry_ms)
    : kind_(std::move(kind)),
      base_retry_ms_(base_retry_ms),
      capacity_(capacity) {
  for (int i = 0; i < std::max(workers, 1); ++i)
    workers_.emplace_back([this] { Loop(); });
}

KindQueue::~KindQueue() { Stop(); }

bool KindQueue::TryRun(std::function<void()> call) {
  if (admitted_.fetch_add(1) >= capacity_.load()) {
    admitted_.fetch_sub(1);
    refused_.fetch_add(1);
    return false;
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    admitted_.fetch_sub(1);
    refused_.fetch_add(1);
    return false;
  }
  queue_.push_back(std::move(call));
  return true;
}

bool KindQueue::TryRunHere(const std::function<bool()>& call) {
  if (admitted_.fetch_add(1) >= capacity_.load()) {
    admitted_.fetch_sub(1);
    return false;
  }
  const bool answered = call();
  admitted_.fetch_sub(1);
  return answered;
}

int KindQueue::RetryAfterMs() {
  return static_cast<int>(JitterMs(base_retry_ms_, 3 * base_retry_ms_).count());
}

void KindQueue::Loop() {
  for (;;) {
    std::function<void()> call;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &KindQueue::Ready));
      if (queue_.empty()) return;  // stopping, and nothing left to answer
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call();
    admitted_.fetch_sub(1);
  }
}

bool KindQueue::Ready() const { return stopping_ || !queue_.empty(); }

void KindQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_)
    if (t.joinable()) t.join();
}

}  // namespace ckpt::coordinator
