#include "coordinator/group_commit.h"

#include <vector>

namespace ckpt::coordinator {

GroupCommitter::GroupCommitter(
    CoordStore* store, std::function<void(const absl::Status&)> on_failure,
    std::function<void(uint64_t)> on_durable)
    : store_(store),
      on_failure_(std::move(on_failure)),
      on_durable_(std::move(on_durable)) {
  writer_ = std::thread([this] { Loop(); });
}

GroupCommitter::~GroupCommitter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

uint64_t GroupCommitter::Enqueue(std::unique_ptr<CoordStore::Batch> batch) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t seq = next_seq_++;
  queue_.emplace_back(seq, std::move(batch));
  cv_.notify_all();
  return seq;
}

uint64_t GroupCommitter::last_enqueued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_seq_ - 1;
}

uint64_t GroupCommitter::groups_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_;
}

absl::Status GroupCommitter::Wait(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_seq_ >= seq; });
  for (const auto& [range, status] : failed_)
    if (seq >= range.first && seq <= range.second) return status;
  return absl::OkStatus();
}

void GroupCommitter::MarkDone(uint64_t upto, const absl::Status& s) {
  if (!s.ok()) {
    failed_.push_back({{done_seq_ + 1, upto}, s});
    while (failed_.size() > 64)
      failed_.pop_front();  // waiters of those are long gone
  }
  done_seq_ = std::max(done_seq_, upto);
  cv_.notify_all();
}

void GroupCommitter::FailQueued(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return;
  uint64_t last = queue_.back().first;
  queue_.clear();
  MarkDone(last, why);
}

void GroupCommitter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::deque<std::pair<uint64_t, std::unique_ptr<CoordStore::Batch>>> group;
    group.swap(queue_);
    lock.unlock();
    std::vector<CoordStore::Batch*> batches;
    for (auto& [seq, b] : group) batches.push_back(b.get());
    absl::Status s = store_->CommitGroup(batches);
    if (!s.ok()) on_failure_(s);
    // Before the waiters wake: what they return must already show as durable.
    if (s.ok() && on_durable_) on_durable_(group.back().first);
    lock.lock();
    ++groups_;
    MarkDone(group.back().first, s);
  }
}

}  // namespace ckpt::coordinator
