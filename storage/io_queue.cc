#include "storage/io_queue.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/status.h"

namespace ckpt::storage {
namespace {

constexpr uint64_t kAlign = 4096;
// prep_read/prep_write take an unsigned length.
constexpr uint64_t kMaxRequestBytes = 1ull << 30;

bool Aligned(uint64_t x) { return x % kAlign == 0; }
bool Aligned(const char* p) { return Aligned(reinterpret_cast<uintptr_t>(p)); }
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

IoQueue::IoQueue(RingPool* pool, IoOp op, unsigned depth, uint64_t io_bytes,
                 std::string what)
    : pool_(pool),
      op_(op),
      depth_(std::max(1u, depth)),
      io_bytes_(std::clamp<uint64_t>(io_bytes / kAlign * kAlign, kAlign,
                                     kMaxRequestBytes)),
      what_(std::move(what)) {
  if (pool_ != nullptr) ring_ = pool_->Borrow();
  slots_.resize(depth_);
  for (unsigned i = 0; i < depth_; ++i) free_slots_.push_back(depth_ - 1 - i);
}

IoQueue::~IoQueue() {
  // What was never submitted is dropped (an owner that wants it done, or
  // the error, calls Finish() itself); what the kernel holds is waited for.
  pending_.clear();
  (void)Finish();
  // A ring whose submit or wait failed may hold stale entries: not reused.
  if (ring_ && !broken_) pool_->Return(std::move(ring_));
}

void IoQueue::Fail(const Request& r, int err) {
  if (!error_.ok()) return;
  if (op_ == IoOp::kRead && err == ENODATA) {
    error_ = absl::DataLossError(
        absl::StrFormat("%s: ends before offset %d (read of %d bytes at %d)",
                        what_, r.off + r.len, r.len, r.off));
    return;
  }
  error_ = ErrnoToStatus(
      err,
      absl::StrFormat("%s: %s of %d bytes at offset %d", what_,
                      op_ == IoOp::kWrite ? "write" : "read", r.len, r.off));
}

void IoQueue::FailRing(const char* call, int err) {
  if (error_.ok()) error_ = ErrnoToStatus(err, absl::StrCat(what_, ": ", call));
  broken_ = true;
}

void IoQueue::Split(int fd, int buffered_fd, char* buf, uint64_t off,
                    uint64_t len, uint64_t extra, uint64_t tag) {
  while (len > 0) {
    uint64_t n = std::min(len, io_bytes_);
    if (ring_) {
      // A request from registered memory must not cross a piece's end.
      const uint64_t room = ring_->table->RoomInPiece(buf);
      if (room > 0) n = std::min(n, room);
    }
    const uint64_t ask = n == len ? n + extra : n;
    pending_.push_back({fd, buffered_fd, buf, off, n, ask, tag, n});
    buf += n;
    off += n;
    len -= n;
  }
}

void IoQueue::Queue(int direct_fd, int buffered_fd, char* buf, uint64_t off,
                    uint64_t len, uint64_t room, uint64_t tag) {
  const uint64_t misalign = reinterpret_cast<uintptr_t>(buf) % kAlign;
  if (direct_fd < 0 || misalign != off % kAlign)
    return Split(buffered_fd, buffered_fd, buf, off, len, 0, tag);
  const uint64_t head = std::min(len, misalign == 0 ? 0 : kAlign - misalign);
  const uint64_t middle = (len - head) / kAlign * kAlign;
  const uint64_t tail = len - head - middle;
  if (head > 0) Split(buffered_fd, buffered_fd, buf, off, head, 0, tag);
  // A read may take its ragged tail directly when whole blocks fit in the
  // caller's room: the kernel stops at the end of the file.
  if (op_ == IoOp::kRead && tail > 0 && room >= head + middle + AlignUp(tail)) {
    Split(direct_fd, buffered_fd, buf + head, off + head, middle + tail,
          AlignUp(tail) - tail, tag);
    return;
  }
  if (middle > 0)
    Split(direct_fd, buffered_fd, buf + head, off + head, middle, 0, tag);
  if (tail > 0)
    Split(buffered_fd, buffered_fd, buf + head + middle, off + head + middle,
          tail, 0, tag);
}

absl::Status IoQueue::Add(int direct_fd, int buffered_fd, char* buf,
                          uint64_t off, uint64_t len) {
  if (!error_.ok()) return error_;
  Queue(direct_fd, buffered_fd, buf, off, len, len, 0);
  if (!ring_) {
    while (error_.ok() && !pending_.empty()) RunOne(nullptr);
  } else if (!broken_) {
    Pump(false);
  }
  return error_;
}

absl::Status IoQueue::Finish() {
  if (!ring_) {
    while (error_.ok() && !pending_.empty()) RunOne(nullptr);
  } else if (!broken_) {
    Pump(true);
  } else {
    // Whatever the kernel still holds writes into the caller's buffers:
    // wait for it before they may go.
    while (inflight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      int ret = io_uring_wait_cqe(&ring_->ring, &cqe);
      if (ret == -EINTR || ret == -EAGAIN) continue;
      if (ret < 0) break;
      io_uring_cqe_seen(&ring_->ring, cqe);
      --inflight_;
    }
  }
  pending_.clear();
  return error_;
}

absl::Status IoQueue::Reap(const Done& done) {
  if (!error_.ok()) return error_;
  if (outstanding() == 0) return absl::OkStatus();
  if (!ring_) {
    RunOne(&done);
  } else if (Submit() && inflight_ > 0) {
    WaitAndDrain(&done);
  }
  return error_;
}

void IoQueue::RunOne(const Done* done) {
  Request r = pending_.front();
  pending_.pop_front();
  const ssize_t n = op_ == IoOp::kWrite ? pwrite(r.fd, r.buf, r.ask, r.off)
                                        : pread(r.fd, r.buf, r.ask, r.off);
  Complete(r, n < 0 ? -errno : static_cast<int>(n), done);
}

void IoQueue::Complete(Request r, int res, const Done* done) {
  if (res == -EAGAIN || res == -EINTR) {
    pending_.push_front(r);
    return;
  }
  const bool direct = r.fd != r.buffered_fd && r.buffered_fd >= 0;
  if (res == -EINVAL && direct) {
    // The file system refused this direct request: the page cache serves it.
    r.fd = r.buffered_fd;
    r.ask = r.len;
    pending_.push_front(r);
    return;
  }
  if (res < 0) return Fail(r, -res);
  if (res == 0) return Fail(r, op_ == IoOp::kWrite ? EIO : ENODATA);
  const uint64_t got = static_cast<uint64_t>(res);
  if (got >= r.len) {
    if (done != nullptr && *done) (*done)(r.tag, r.report);
    return;
  }
  r.buf += got;
  r.off += got;
  r.len -= got;
  if (direct && Aligned(r.buf) && Aligned(r.off)) {
    r.ask -= got;
  } else {
    r.fd = r.buffered_fd >= 0 ? r.buffered_fd : r.fd;
    r.ask = r.len;
  }
  pending_.push_front(r);
}

bool IoQueue::Submit() {
  io_uring* ring = &ring_->ring;
  while (error_.ok() && inflight_ < depth_ && !pending_.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) break;
    const Request r = pending_.front();
    pending_.pop_front();
    const unsigned slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = r;
    const int index = ring_->table->Find(r.buf, r.ask);
    const unsigned n = static_cast<unsigned>(r.ask);
    if (op_ == IoOp::kWrite) {
      if (index >= 0)
        io_uring_prep_write_fixed(sqe, r.fd, r.buf, n, r.off, index);
      else
        io_uring_prep_write(sqe, r.fd, r.buf, n, r.off);
    } else {
      if (index >= 0)
        io_uring_prep_read_fixed(sqe, r.fd, r.buf, n, r.off, index);
      else
        io_uring_prep_read(sqe, r.fd, r.buf, n, r.off);
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++inflight_;
  }
  for (;;) {
    const unsigned unsubmitted = io_uring_sq_ready(ring);
    if (unsubmitted == 0) return true;
    const int ret = io_uring_submit(ring);
    if (ret >= 0) return true;
    if (ret == -EINTR) continue;
    if (ret == -EAGAIN || ret == -EBUSY) {
      // The kernel is short of memory, or its completion queue is full:
      // a completion frees both, and the next Submit sends the rest. With
      // nothing of ours in the kernel there is none to wait for: again.
      if (inflight_ > unsubmitted) return true;
      continue;
    }
    // The kernel took none of them; those it took before are waited for.
    inflight_ -= unsubmitted;
    FailRing("io_uring_submit", -ret);
    return false;
  }
}

bool IoQueue::WaitAndDrain(const Done* done) {
  io_uring* ring = &ring_->ring;
  io_uring_cqe* cqe = nullptr;
  int ret;
  do ret = io_uring_wait_cqe(ring, &cqe);
  while (ret == -EINTR || ret == -EAGAIN);
  if (ret < 0) {
    FailRing("io_uring_wait_cqe", -ret);
    return false;
  }
  do {
    const unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    free_slots_.push_back(slot);
    --inflight_;
    Complete(slots_[slot], res, done);
  } while (io_uring_peek_cqe(ring, &cqe) == 0);
  return true;
}

void IoQueue::Pump(bool wait_all) {
  for (;;) {
    if (!Submit()) return;
    if (inflight_ == 0) return;
    const bool room = inflight_ < depth_ && error_.ok();
    if (!wait_all && room && pending_.empty()) return;
    if (!WaitAndDrain(nullptr)) return;
  }
}

}  // namespace ckpt::storage
