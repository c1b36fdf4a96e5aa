// The queue of dropped arenas and its thread. See arena_drops.h.
#include "daemon/pipeline/arena_drops.h"

#include <string>
#include <utility>

namespace ckpt::daemon {
namespace {

// An arena's name without its directory: the same arena may be named in
// /dev/shm ("/x") or on hugetlbfs ("/dev/hugepages/x"), and a new one of
// either kind must wait for the unlink of an old one of the other.
std::string Key(const std::string& name) {
  return name.substr(name.rfind('/') + 1);
}

}  // namespace

ArenaDrops::ArenaDrops(storage::Backend* backend) : backend_(backend) {
  thread_ = std::thread([this] { Loop(); });
}

ArenaDrops::~ArenaDrops() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void ArenaDrops::Drop(std::shared_ptr<shm::Arena> arena, bool registered,
                      bool unlink) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unlink) unlinking_.insert(Key(arena->name()));
    queue_.push_back(Pending{std::move(arena), registered, unlink});
    ++queued_;
  }
  work_cv_.notify_all();
}

void ArenaDrops::AwaitUnlinked(const std::string& name) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return unlinking_.count(Key(name)) == 0; });
}

void ArenaDrops::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t until = queued_;
  done_cv_.wait(lock, [&] { return done_ >= until; });
}

void ArenaDrops::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // What is queued is finished even when stopping: an arena the table
    // dropped must not stay named.
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    const std::string name = p.arena->name();
    lock.unlock();
    if (p.registered) backend_->UnregisterMemory(p.arena->slot_data(0));
    if (p.unlink) (void)shm::Arena::Unlink(name);
    p.arena.reset();  // the unmap, if this was the last reference
    lock.lock();
    if (p.unlink) unlinking_.erase(unlinking_.find(Key(name)));
    ++done_;
    done_cv_.notify_all();
  }
}

}  // namespace ckpt::daemon
