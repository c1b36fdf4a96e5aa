// The object tier's queue and threads. See uploader.h.
#include "daemon/pipeline/uploader.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/core/due_task.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {
namespace {

constexpr auto kFirstRetry = std::chrono::milliseconds(200);
constexpr auto kMaxRetry = std::chrono::seconds(30);

}  // namespace

Uploader::Uploader(storage::Backend* object, unsigned threads, RunFn run,
                   Catalog* intents, CatalogWriter* writer,
                   const DaemonClock* clock)
    : object_(object),
      threads_(std::max(1u, threads)),
      run_(std::move(run)),
      intents_(intents),
      writer_(writer),
      clock_(clock != nullptr ? clock : DaemonClock::Real()) {}

Uploader::~Uploader() { Stop(); }

void Uploader::Start() {
  for (unsigned i = 0; i < threads_; ++i)
    workers_.emplace_back([this] { Loop(); });
}

void Uploader::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void Uploader::Push(UploadTask task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (task.kind == UploadTask::kShard) {
      auto& [shards, bytes] = pending_[{task.job, task.step}];
      ++shards;
      bytes += task.bytes;
    }
    task.seq = next_seq_++;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

UploadBacklog Uploader::Backlog() const {
  std::lock_guard<std::mutex> lock(mu_);
  UploadBacklog b;
  b.steps = static_cast<uint32_t>(pending_.size());
  for (const auto& [step, count] : pending_) {
    b.shards += count.first;
    b.bytes += count.second;
  }
  b.uploaded_shards = uploaded_shards_;
  b.uploaded_bytes = uploaded_bytes_;
  b.failed = failed_;
  b.last_error = last_error_;
  b.last_upload_s = last_upload_s_;
  return b;
}

void Uploader::CountUploaded(uint64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  last_upload_s_ = seconds;
  ++uploaded_shards_;
  uploaded_bytes_ += bytes;
}

bool Uploader::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tasks_.empty() && busy_ == 0;
}

bool Uploader::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] { return tasks_.empty() && busy_ == 0; });
}

absl::Status Uploader::RunDelete(UploadTask& task) {
  // Never before its intent is recorded (persister.cc says why).
  if (task.ticket != 0 && writer_ != nullptr) {
    if (!writer_->Wait(task.ticket).ok()) task.intent = 0;
    task.ticket = 0;
  }
  while (!task.keys.empty()) {
    absl::Status s = object_->Delete(task.keys.front());
    if (!s.ok()) return s;
    task.keys.erase(task.keys.begin());
  }
  return absl::OkStatus();
}

void Uploader::Finish(const UploadTask& task, absl::Status status) {
  if (status.ok() || absl::IsCancelled(status)) {
    // Done, or no longer wanted (the shard was deleted or replaced).
    if (task.kind == UploadTask::kShard) {
      auto it = pending_.find({task.job, task.step});
      if (it != pending_.end()) {
        it->second.first -= 1;
        it->second.second -= std::min(it->second.second, task.bytes);
        if (it->second.first == 0) pending_.erase(it);
      }
    }
    return;
  }
  ++failed_;
  last_error_ = std::string(status.message()).substr(0, 512);
  UploadTask retry = task;
  ++retry.attempts;
  auto delay = kFirstRetry * (1u << std::min(retry.attempts - 1, 10u));
  retry.not_before =
      clock_->Now() +
      std::min<std::chrono::steady_clock::duration>(delay, kMaxRetry);
  LogWarning(absl::StrCat(
      "object tier: ", task.kind == UploadTask::kDelete ? "delete" : "upload",
      " of job ", task.job, " step ", task.step, " (attempt ", retry.attempts,
      "): ", status.message()));
  // Back in its place: later tasks on its keys still wait for it.
  auto at = std::upper_bound(
      tasks_.begin(), tasks_.end(), retry.seq,
      [](uint64_t seq, const UploadTask& t) { return seq < t.seq; });
  tasks_.insert(at, std::move(retry));
}

std::optional<UploadTask> Uploader::TakeLocked(
    std::unique_lock<std::mutex>& lock) {
  std::set<std::string_view> earlier;  // keys of the tasks passed over
  return TakeDueTask(
      *clock_, tasks_, cv_, lock, [&](const UploadTask& t, bool due) {
        bool free = due;
        for (const std::string& k : t.keys)
          free = free && !earlier.count(k) && !running_keys_.count(k);
        if (free) return true;
        earlier.insert(t.keys.begin(), t.keys.end());
        return false;
      });
}

void Uploader::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    std::optional<UploadTask> due = TakeLocked(lock);
    if (!due) continue;
    UploadTask task = std::move(*due);
    ++busy_;
    const std::vector<std::string> keys = task.keys;  // RunDelete eats them
    running_keys_.insert(keys.begin(), keys.end());
    lock.unlock();
    absl::Status s =
        task.kind == UploadTask::kDelete ? RunDelete(task) : run_(task);
    if (s.ok() && task.intent != 0 && intents_ != nullptr) {
      absl::Status f = intents_->ForgetDeleteIntent(task.intent);
      if (!f.ok()) LogWarning(std::string(f.message()));  // redone at start
    }
    lock.lock();
    for (const std::string& k : keys)
      running_keys_.erase(running_keys_.find(k));
    --busy_;
    Finish(task, std::move(s));
    cv_.notify_all();
  }
}

}  // namespace ckpt::daemon
