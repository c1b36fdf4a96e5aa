// A pool of io_uring instances sharing one table of registered buffers
// (io_uring_register_buffers). A ring is borrowed for the life of one
// IoQueue (io_queue.h) and returned; registering buffers is paid once per
// ring per change of the table, never per object, and a ring idles with no
// unregistered memory pinned.
//
// RingPool is thread-safe; a borrowed Ring belongs to its borrower.
#ifndef CKPT_STORAGE_RING_POOL_H_
#define CKPT_STORAGE_RING_POOL_H_

#include <liburing.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"

namespace ckpt::storage {

// The kernel refuses a registered buffer above 1 GiB.
inline constexpr uint64_t kMaxRegisteredPiece = 1ull << 30;

struct RegisteredTable {
  std::vector<iovec>
      pieces;  // sorted by base, each at most kMaxRegisteredPiece
  // Index of the piece holding [p, p+len), or -1.
  int Find(const char* p, uint64_t len) const;
  // Bytes from p to the end of its piece (p must be inside one), else 0.
  uint64_t RoomInPiece(const char* p) const;
};

struct Ring {
  io_uring ring;
  uint64_t generation = 0;  // of the pool's table when registered here
  std::shared_ptr<const RegisteredTable> table;  // what the kernel knows
  ~Ring() { io_uring_queue_exit(&ring); }
};

class RingPool {
 public:
  RingPool(unsigned depth, size_t max_idle);
  // False when the kernel refused to create a ring (no io_uring).
  bool Probe();
  // A ring with the current table registered, or null if none can be made.
  std::unique_ptr<Ring> Borrow();
  // Takes the ring back; one registered under an older table is brought up
  // to date first, so it pins no unregistered memory while idle.
  void Return(std::unique_ptr<Ring> ring);
  [[nodiscard]] absl::Status Register(void* base, uint64_t len);
  // After it returns, no idle ring pins the region's pages; a borrowed ring
  // drops them when it is returned.
  void Unregister(void* base);

 private:
  std::unique_ptr<Ring> NewRing();
  // Brings the ring's registration to the table of `generation`; -errno if
  // the kernel refused (the ring then has no registered buffers).
  int Sync(Ring* ring, uint64_t generation,
           std::shared_ptr<const RegisteredTable> table);

  const unsigned depth_;
  const size_t max_idle_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Ring>> idle_;
  struct Region {
    char* base;
    uint64_t len;
  };
  std::vector<Region> regions_;
  std::shared_ptr<const RegisteredTable> table_;
  uint64_t generation_ = 1;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_RING_POOL_H_
