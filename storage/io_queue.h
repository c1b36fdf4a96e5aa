// IoQueue: the one io_uring loop of the tree. It runs one file's reads or
// writes with several requests in flight, the liburing io_uring-cp way:
// fill the queue up to its depth, submit, wait for one completion, drain
// the rest. Every completion, from the ring or from the pread/pwrite used
// without one, goes through one function: short transfers are re-queued,
// -EAGAIN/-EINTR resubmitted, a direct request the file system refuses
// (-EINVAL) goes again through the buffered descriptor, and the end of a
// file is DataLoss.
//
// A range is queued as requests of at most io_bytes: its 4 KiB-aligned
// middle through an O_DIRECT descriptor (when the buffer and the file
// offset share their alignment), the ragged ends through a buffered one. A
// read whose caller has room past the range may finish its ragged tail
// directly, rounded up to whole blocks. Requests from memory registered
// with the RingPool (ring_pool.h) use the fixed-buffer opcodes.
//
// Two ways to drive it: Add() then Finish() (the local backend: Add
// returns once the rest fits in the queue), or Queue() then Reap(), which
// reports each finished request's tag, so a caller can use a range the
// moment its last request completes while the next ones are read (the
// client's file restore).
//
// Thread-safety: an IoQueue belongs to one thread at a time; it holds a
// ring borrowed from the pool for its lifetime (none: pread/pwrite).
#ifndef CKPT_STORAGE_IO_QUEUE_H_
#define CKPT_STORAGE_IO_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/ring_pool.h"

namespace ckpt::storage {

enum class IoOp { kRead, kWrite };

class IoQueue {
 public:
  // Called as each request finishes: its tag and its length as queued.
  using Done = std::function<void(uint64_t tag, uint64_t len)>;

  // pool may be null (pread/pwrite). `what` names the file in errors.
  IoQueue(RingPool* pool, IoOp op, unsigned depth, uint64_t io_bytes,
          std::string what);
  // Drops what is queued but not submitted; waits for every request the
  // kernel holds (it writes into the caller's buffers).
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // Queues [buf, buf+len) at file offset off (see the header paragraph).
  // direct_fd is the file opened with O_DIRECT, or -1; buffered_fd is the
  // same file without. A read may write up to `room` >= len bytes at buf
  // (room == len: exactly the range). Nothing is submitted here.
  void Queue(int direct_fd, int buffered_fd, char* buf, uint64_t off,
             uint64_t len, uint64_t room, uint64_t tag);
  // Queue() with room == len, then runs the queue until what is left fits
  // in it. The first error seen so far.
  [[nodiscard]] absl::Status Add(int direct_fd, int buffered_fd, char* buf,
                                 uint64_t off, uint64_t len);
  // Waits for every queued request; the first error, if any.
  [[nodiscard]] absl::Status Finish();
  // Submits what is queued and blocks until at least one request finishes
  // (none outstanding: returns at once); calls done for each finished one.
  // The first error names the file and offset; nothing more is submitted.
  [[nodiscard]] absl::Status Reap(const Done& done);

  // Requests not finished yet (queued or in flight).
  size_t outstanding() const { return pending_.size() + inflight_; }
  // True when every queued request is in flight: time to queue more, so a
  // completion finds a request to submit in its place.
  bool WantsMore() const { return pending_.empty(); }
  bool uses_ring() const { return ring_ != nullptr; }

 private:
  struct Request {
    int fd;           // direct_fd or buffered_fd
    int buffered_fd;  // fd == buffered_fd: a buffered request
    char* buf;
    uint64_t off;
    uint64_t len;  // bytes wanted
    uint64_t ask;  // bytes asked of the kernel (> len: a rounded-up read)
    uint64_t tag;
    uint64_t report;  // len as queued, reported when done
  };
  // Splits [buf, buf+len) into requests of at most io_bytes on fd; the
  // last one asks for `extra` bytes more.
  void Split(int fd, int buffered_fd, char* buf, uint64_t off, uint64_t len,
             uint64_t extra, uint64_t tag);
  // Runs the ring until nothing is pending and there is room (wait_all:
  // until nothing is outstanding).
  void Pump(bool wait_all);
  // Moves pending requests into the ring and submits them; false when the
  // ring broke.
  bool Submit();
  // Waits for one completion and drains every ready one; false on a
  // broken ring.
  bool WaitAndDrain(const Done* done);
  // One pread/pwrite of the first pending request (no ring).
  void RunOne(const Done* done);
  // Applies a completion of res bytes (or -errno) to r.
  void Complete(Request r, int res, const Done* done);
  void Fail(const Request& r, int err);
  void FailRing(const char* call, int err);

  RingPool* pool_;
  const IoOp op_;
  const unsigned depth_;
  const uint64_t io_bytes_;
  const std::string what_;
  std::unique_ptr<Ring> ring_;
  std::deque<Request> pending_;
  std::vector<Request> slots_;
  std::vector<unsigned> free_slots_;
  unsigned inflight_ = 0;  // in the ring: submitted, or prepared
  bool broken_ = false;
  absl::Status error_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_IO_QUEUE_H_
