// Prefaulter: reserves and faults in the slots of new arenas on one
// background thread.
//
// Creating an arena allocates and faults in only the slot the first save
// writes (see shm::Arena::Create's prefault_slots); the remaining slots'
// pages are allocated and zeroed here (shm::Arena::ReserveSlots), off every
// RPC's path. When an arena is done, `done` runs on
// the prefaulter's thread with no lock of the prefaulter held (the engine
// registers the arena's memory with the storage backend then: registering
// pins, and so faults, every page).
//
// Ownership: each queued arena is shared with its owner, so its mapping
// stays valid until the prefaulter is done with it even if the owner drops
// it meanwhile. Thread-safety: Add is safe from any thread; the destructor
// drops what is still queued and joins the thread (callers must not hold a
// lock that `done` takes).
#ifndef CKPT_DAEMON_PREFAULTER_H_
#define CKPT_DAEMON_PREFAULTER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "shm/arena.h"

namespace ckpt::daemon {

class Prefaulter {
 public:
  using DoneFn =
      std::function<void(const std::shared_ptr<shm::Arena>&, absl::Status)>;
  explicit Prefaulter(DoneFn done);
  ~Prefaulter();
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Queues the slots from `first_slot` on of `arena`.
  void Add(std::shared_ptr<shm::Arena> arena, uint32_t first_slot);

 private:
  void Loop();

  const DoneFn done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<shm::Arena>, uint32_t>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PREFAULTER_H_
