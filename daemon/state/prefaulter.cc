// The prefaulter's queue and thread. See prefaulter.h.
#include "daemon/state/prefaulter.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

Prefaulter::Prefaulter(JobTable* table, storage::Backend* backend)
    : table_(table), backend_(backend) {
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

void Prefaulter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (!stopping_ && (queue_.empty() || holds_ > 0)) {
      held_back_ = !queue_.empty();
      if (held_back_) cv_.notify_all();  // AwaitHeldBack
      cv_.wait(lock);
    }
    held_back_ = false;
    if (stopping_) return;
    auto [arena, first] = std::move(queue_.front());
    queue_.pop_front();
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
