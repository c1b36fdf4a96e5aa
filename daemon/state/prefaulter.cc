// The prefaulter's queue and thread. See prefaulter.h.
#include "daemon/state/prefaulter.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

Prefaulter::Prefaulter(JobTable* table, storage::Backend* backend,
                       std::chrono::milliseconds read_hold)
    : table_(table), backend_(backend), read_hold_(read_hold) {
  thread_ = std::thread([this] { Loop(); });
}

Prefaulter::~Prefaulter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  thread_.join();
}

void Prefaulter::Add(std::shared_ptr<shm::Arena> arena, uint32_t first_slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(arena), first_slot);
  }
  cv_.notify_all();
}

void Prefaulter::Hold::Take() {
  if (held_ || p_ == nullptr) return;
  held_ = true;
  std::lock_guard<std::mutex> lock(p_->mu_);
  ++p_->holds_;
}

void Prefaulter::Hold::Release() {
  if (!held_) return;
  held_ = false;
  {
    std::lock_guard<std::mutex> lock(p_->mu_);
    --p_->holds_;
  }
  p_->cv_.notify_all();
}

void Prefaulter::AwaitHeldBack() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return held_back_; });
}

void Prefaulter::BeginRead(const std::string& arena) {
  std::lock_guard<std::mutex> lock(mu_);
  Reads& r = reads_[arena];
  if (r.open++ == 0) r.since = std::chrono::steady_clock::now();
}

void Prefaulter::EndRead(const std::string& arena) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reads_.find(arena);
    if (it == reads_.end()) return;
    if (--it->second.open > 0) return;
    reads_.erase(it);
  }
  cv_.notify_all();
}

void Prefaulter::ReadHold::Take(Prefaulter* p, std::string arena) {
  reset();
  if (p == nullptr) return;
  p_ = p;
  arena_ = std::move(arena);
  p_->BeginRead(arena_);
}

void Prefaulter::ReadHold::reset() {
  if (p_ == nullptr) return;
  p_->EndRead(arena_);
  p_ = nullptr;
  arena_.clear();
}

void Prefaulter::Loop() {
  using Clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // The first queued arena no open restore holds back (or whose hold ran
    // past read_hold_); otherwise wait for a change or the earliest bound.
    auto next = queue_.end();
    auto until = Clock::time_point::max();
    if (!stopping_ && holds_ == 0) {
      const auto now = Clock::now();
      for (auto q = queue_.begin(); q != queue_.end(); ++q) {
        auto r = reads_.find(q->first->name());
        if (r == reads_.end() || r->second.since + read_hold_ <= now) {
          next = q;
          break;
        }
        until = std::min(until, r->second.since + read_hold_);
      }
    }
    if (stopping_) return;
    if (next == queue_.end()) {
      held_back_ = !queue_.empty();
      if (held_back_) cv_.notify_all();  // AwaitHeldBack
      if (until == Clock::time_point::max())
        cv_.wait(lock);
      else
        cv_.wait_until(lock, until);
      continue;
    }
    held_back_ = false;
    auto [arena, first] = std::move(*next);
    queue_.erase(next);
    lock.unlock();
    Ready(arena, first);
    arena.reset();
    lock.lock();
  }
}

void Prefaulter::Ready(const std::shared_ptr<shm::Arena>& arena,
                       uint32_t first) {
  absl::Status status = arena->ReserveSlots(first, arena->num_slots());
  bool registered = false;
  if (!status.ok()) {
    LogWarning(absl::StrCat("arena ", arena->name(),
                            ": only slot 0 is usable: ", status.message()));
  } else {
    absl::Status reg = backend_->RegisterMemory(
        arena->slot_data(0),
        uint64_t{arena->num_slots()} * arena->slot_bytes());
    registered = reg.ok();
    if (!registered)
      LogWarning("register arena memory: " + std::string(reg.message()));
  }
  // Dropped meanwhile: our reference still keeps it mapped.
  if (!table_->RecordPrefaulted(arena, status, registered) && registered)
    backend_->UnregisterMemory(arena->slot_data(0));
}

}  // namespace ckpt::daemon
