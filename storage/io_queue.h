// Internals of the local backend: a pool of io_uring instances sharing one
// table of registered buffers, and IoQueue, which runs one object's reads or
// writes with several requests in flight (the liburing io_uring-cp loop:
// fill the queue, submit, wait for one completion, drain the rest; short
// transfers re-queued, -EAGAIN/-EINTR resubmitted). Without a ring the same
// requests run as pread/pwrite loops.
//
// RingPool is thread-safe. An IoQueue belongs to one thread at a time and
// holds one ring borrowed from the pool for its lifetime, so registering
// buffers is paid once per ring per change of the table, never per object.
#ifndef CKPT_STORAGE_IO_QUEUE_H_
#define CKPT_STORAGE_IO_QUEUE_H_

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ckpt::storage::internal {

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

enum class IoOp { kRead, kWrite };

class IoQueue {
 public:
  // pool may be null (pread/pwrite). `what` names the object in errors.
  IoQueue(RingPool* pool, IoOp op, unsigned depth, uint64_t io_bytes,
          std::string what);
  ~IoQueue();  // waits for every request in flight
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // Queues [buf, buf+len) at file offset off on fd, split into io_bytes
  // requests; returns once the rest fits in the queue. direct_fd is fd opened
  // with O_DIRECT, or -1; fallback_fd is buffered and takes any remainder
  // that a short direct transfer leaves unaligned. Returns the first error
  // seen so far.
  [[nodiscard]] absl::Status Add(int fd, int fallback_fd, char* buf,
                                 uint64_t off, uint64_t len);
  // Waits for every queued request; the first error, if any.
  [[nodiscard]] absl::Status Finish();
  bool uses_ring() const { return ring_ != nullptr; }

 private:
  struct Request {
    int fd;
    int fallback_fd;
    char* buf;
    uint64_t off;
    uint64_t len;
  };
  void Pump(bool wait_all);
  void Complete(unsigned slot, int res);
  void RunSync(Request r);
  void Fail(const Request& r, int err);

  RingPool* pool_;
  const IoOp op_;
  const unsigned depth_;
  const uint64_t io_bytes_;
  const std::string what_;
  std::unique_ptr<Ring> ring_;
  std::deque<Request> pending_;
  std::vector<Request> slots_;
  std::vector<unsigned> free_slots_;
  unsigned inflight_ = 0;
  bool broken_ = false;
  absl::Status error_;
};

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_IO_QUEUE_H_
