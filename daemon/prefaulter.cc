#include "daemon/prefaulter.h"

namespace ckpt::daemon {

Prefaulter::Prefaulter(DoneFn done) : done_(std::move(done)) {
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

void Prefaulter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto [arena, first] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    absl::Status s = arena->ReserveSlots(first, arena->num_slots());
    done_(arena, std::move(s));
    arena.reset();
    lock.lock();
  }
}

}  // namespace ckpt::daemon
