// FileReadQueue: one shard file opened once for reading, and a queue that
// keeps up to `depth` requests of at most `io_bytes` in flight on it through
// io_uring: the raw read that bench/raw_io.cc measures as the device limit
// (the liburing io_uring-cp loop: fill, submit, wait one completion, drain;
// short transfers re-queued, -EAGAIN/-EINTR resubmitted). A request whose
// buffer, offset and length are 4 KiB-aligned goes through an O_DIRECT
// descriptor; the unaligned rest, a file system that refuses O_DIRECT, and a
// kernel without io_uring (then synchronous pread) use a buffered one.
//
// The caller tags each request; Reap() reports every finished request's tag
// and length, so a caller can hand a chunk on the moment its last request
// completes while the queue keeps reading the next ones.
//
// Thread-safety: not thread-safe; one thread adds and reaps.
#ifndef CKPT_CLIENT_FILE_READ_QUEUE_H_
#define CKPT_CLIENT_FILE_READ_QUEUE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::client {

class FileReadQueue {
 public:
  // The raw read's settings (bench/raw_io.h RawIoOptions).
  static constexpr unsigned kDepth = 8;
  static constexpr uint64_t kIoBytes = 4 << 20;

  // Opens path; an error names it (PermissionDenied, NotFound, ...), and
  // DataLoss if it is not a regular file of exactly file_bytes bytes.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FileReadQueue>> Open(
      const std::string& path, uint64_t file_bytes, unsigned depth = kDepth,
      uint64_t io_bytes = kIoBytes);
  ~FileReadQueue();  // waits for every request in flight, closes the file
  FileReadQueue(const FileReadQueue&) = delete;
  FileReadQueue& operator=(const FileReadQueue&) = delete;

  // Requests not yet finished (queued or in flight).
  size_t outstanding() const { return pending_.size() + inflight_; }
  // True when every queued request is in flight: time to Add more, so the
  // next completion finds a request to submit in its place.
  bool WantsMore() const { return pending_.empty(); }

  // Queues a read of [offset, offset+len) into buf, tagged, as requests of
  // at most io_bytes. `room` >= len bytes at buf may be written: a direct
  // read may then be rounded up to 4 KiB (it stops at the end of the file).
  void Add(char* buf, uint64_t offset, uint64_t len, uint64_t room,
           uint64_t tag);
  // Submits what is queued and blocks until at least one request finishes
  // (none outstanding: returns at once); calls done(tag, len) for each
  // finished request, len being its part of the Add. The
  // first error names the path and offset; the queue is then broken.
  [[nodiscard]] absl::Status Reap(
      const std::function<void(uint64_t tag, uint64_t len)>& done);

 private:
  struct Request {
    char* buf;
    uint64_t offset;
    uint64_t len;  // bytes wanted
    uint64_t ask;  // bytes asked of the kernel (>= len when rounded up)
    bool direct;
    uint64_t tag;
    uint64_t report;  // len of the request as queued, reported when done
  };
  FileReadQueue(std::string path, unsigned depth, uint64_t io_bytes);
  void Push(Request r);
  // Applies a completion of res bytes (or -errno) to r; false on an error.
  bool Complete(Request r, int res,
                const std::function<void(uint64_t, uint64_t)>& done);
  [[nodiscard]] absl::Status RunSync(
      const std::function<void(uint64_t, uint64_t)>& done);

  const std::string path_;
  const unsigned depth_;
  const uint64_t io_bytes_;
  int direct_fd_ = -1;
  int buffered_fd_ = -1;
  struct Ring;
  std::unique_ptr<Ring> ring_;  // null: no io_uring, synchronous pread
  std::deque<Request> pending_;
  std::vector<Request> slots_;
  std::vector<unsigned> free_slots_;
  unsigned inflight_ = 0;
  absl::Status error_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_FILE_READ_QUEUE_H_
