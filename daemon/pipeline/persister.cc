// The persist queue and its thread. See persister.h.
#include "daemon/pipeline/persister.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/core/due_task.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

Persister::Persister(storage::Backend* backend, RunFn run, Catalog* intents,
                     CatalogWriter* writer, const DaemonClock* clock)
    : backend_(backend),
      run_(std::move(run)),
      intents_(intents),
      writer_(writer),
      clock_(clock != nullptr ? clock : DaemonClock::Real()) {}

Persister::~Persister() { Stop(); }

void Persister::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Persister::Stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void Persister::Push(PersistTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    queued_.store(tasks_.size(), std::memory_order_relaxed);
  }
  work_cv_.notify_all();
}

size_t Persister::Size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.size();
}

bool Persister::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.empty() && !busy_;
}

bool Persister::WaitIdle(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout,
                           [&] { return tasks_.empty() && !busy_; });
}

void Persister::QueueDelete(std::string key, bool prefix, uint64_t intent,
                            uint64_t ticket) {
  PersistTask t;
  t.kind = PersistTask::kDelete;
  t.key = std::move(key);
  t.prefix = prefix;
  t.intent = intent;
  t.ticket = ticket;
  Push(std::move(t));
}

void Persister::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    std::optional<PersistTask> due =
        TakeDueTask(*clock_, tasks_, work_cv_, lock);
    if (!due) continue;
    PersistTask task = std::move(*due);
    queued_.store(tasks_.size(), std::memory_order_relaxed);
    busy_ = true;
    running_.store(true, std::memory_order_relaxed);
    lock.unlock();
    if (task.kind == PersistTask::kDelete) {
      // Never before its intent is recorded: a forget that overtook the
      // record would leave an intent to delete a key written again later.
      // Without one the delete still runs (not redone after a crash).
      if (task.ticket != 0 && writer_ != nullptr &&
          !writer_->Wait(task.ticket).ok())
        task.intent = 0;
      absl::Status s = task.prefix ? backend_->DeletePrefix(task.key)
                                   : backend_->Delete(task.key);
      if (!s.ok())
        LogWarning(absl::StrCat("delete ", task.key, ": ", s.message()));
      else if (task.intent != 0 && intents_ != nullptr)
        s = intents_->ForgetDeleteIntent(task.intent);
      if (!s.ok() && task.intent != 0)
        LogWarning(
            absl::StrCat("delete ", task.key, ": left for the next start"));
    } else {
      run_(task);
    }
    NoteProgress();
    running_.store(false, std::memory_order_relaxed);
    lock.lock();
    busy_ = false;
    idle_cv_.notify_all();
  }
}

}  // namespace ckpt::daemon
