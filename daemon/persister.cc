// The persist queue and its thread. See persister.h.
#include "daemon/persister.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/engine_util.h"

namespace ckpt::daemon {

Persister::Persister(std::mutex* mu, std::condition_variable* cv,
                     storage::Backend* backend, RunFn run)
    : mu_(mu), cv_(cv), backend_(backend), run_(std::move(run)) {}

Persister::~Persister() { Stop(); }

void Persister::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Persister::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    stopping_ = true;
  }
  cv_->notify_all();
  thread_.join();
}

void Persister::QueueDelete(std::string key, bool prefix) {
  PersistTask t;
  t.kind = PersistTask::kDelete;
  t.key = std::move(key);
  t.prefix = prefix;
  tasks_.push_back(std::move(t));
}

void Persister::Loop() {
  std::unique_lock<std::mutex> lock(*mu_);
  while (!stopping_) {
    auto now = std::chrono::steady_clock::now();
    auto ready = tasks_.end();
    auto earliest = std::chrono::steady_clock::time_point::max();
    for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
      if (it->not_before <= now) {
        ready = it;
        break;
      }
      earliest = std::min(earliest, it->not_before);
    }
    if (ready == tasks_.end()) {
      if (earliest == std::chrono::steady_clock::time_point::max())
        cv_->wait(lock);
      else
        cv_->wait_until(lock, earliest);
      continue;
    }
    PersistTask task = std::move(*ready);
    tasks_.erase(ready);
    busy_ = true;
    lock.unlock();
    if (task.kind == PersistTask::kDelete) {
      absl::Status s = task.prefix ? backend_->DeletePrefix(task.key)
                                   : backend_->Delete(task.key);
      if (!s.ok())
        LogWarning(absl::StrCat("delete ", task.key, ": ", s.message()));
    } else {
      run_(task);
    }
    lock.lock();
    busy_ = false;
    cv_->notify_all();
  }
}

}  // namespace ckpt::daemon
