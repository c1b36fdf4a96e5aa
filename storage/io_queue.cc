#include "storage/io_queue.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "util/status.h"

namespace ckpt::storage::internal {
namespace {
constexpr uint64_t kAlign = 4096;
// prep_read/prep_write take an unsigned length.
constexpr uint64_t kMaxRequestBytes = 1ull << 30;
}  // namespace

int RegisteredTable::Find(const char* p, uint64_t len) const {
  auto it = std::upper_bound(pieces.begin(), pieces.end(), p,
                             [](const char* x, const iovec& v) {
                               return x < static_cast<const char*>(v.iov_base);
                             });
  if (it == pieces.begin()) return -1;
  --it;
  const char* base = static_cast<const char*>(it->iov_base);
  if (p + len > base + it->iov_len) return -1;
  return static_cast<int>(it - pieces.begin());
}

uint64_t RegisteredTable::RoomInPiece(const char* p) const {
  int i = Find(p, 1);
  if (i < 0) return 0;
  return static_cast<const char*>(pieces[i].iov_base) + pieces[i].iov_len - p;
}

RingPool::RingPool(unsigned depth, size_t max_idle)
    : depth_(depth),
      max_idle_(max_idle),
      table_(std::make_shared<RegisteredTable>()) {}

std::unique_ptr<Ring> RingPool::NewRing() {
  auto ring = std::make_unique<Ring>();
  if (io_uring_queue_init(depth_, &ring->ring, 0) < 0) {
    ring.release();  // never initialised: nothing to exit
    return nullptr;
  }
  ring->table = std::make_shared<RegisteredTable>();
  return ring;
}

bool RingPool::Probe() {
  std::unique_ptr<Ring> ring = NewRing();
  if (!ring) return false;
  Return(std::move(ring));
  return true;
}

int RingPool::Sync(Ring* ring, uint64_t generation,
                   std::shared_ptr<const RegisteredTable> table) {
  if (ring->generation == generation) return 0;
  if (!ring->table->pieces.empty()) io_uring_unregister_buffers(&ring->ring);
  ring->table = std::make_shared<RegisteredTable>();
  ring->generation = generation;
  if (table->pieces.empty()) return 0;
  int ret =
      io_uring_register_buffers(&ring->ring, table->pieces.data(),
                                static_cast<unsigned>(table->pieces.size()));
  if (ret < 0)
    return ret;  // the ring stays usable, with plain reads and writes
  ring->table = std::move(table);
  return 0;
}

std::unique_ptr<Ring> RingPool::Borrow() {
  std::unique_ptr<Ring> ring;
  uint64_t generation;
  std::shared_ptr<const RegisteredTable> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      ring = std::move(idle_.back());
      idle_.pop_back();
    }
    generation = generation_;
    table = table_;
  }
  if (!ring) ring = NewRing();
  if (ring) Sync(ring.get(), generation, std::move(table));
  return ring;
}

void RingPool::Return(std::unique_ptr<Ring> ring) {
  uint64_t generation;
  std::shared_ptr<const RegisteredTable> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = generation_;
    table = table_;
  }
  // A ring borrowed across an Unregister still pins the region's pages:
  // brought up to date before it idles, not when next borrowed.
  if (ring->generation != generation)
    Sync(ring.get(), generation, std::move(table));
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(ring));
}

absl::Status RingPool::Register(void* base, uint64_t len) {
  char* p = static_cast<char*>(base);
  uint64_t generation;
  std::shared_ptr<const RegisteredTable> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Region& r : regions_) {
      if (p < r.base + r.len && r.base < p + len)
        return absl::AlreadyExistsError(absl::StrFormat(
            "RegisterMemory(%p, %d): overlaps the registered region at %p",
            base, len, r.base));
    }
    regions_.push_back({p, len});
    auto next = std::make_shared<RegisteredTable>(*table_);
    for (uint64_t off = 0; off < len; off += kMaxRegisteredPiece)
      next->pieces.push_back(
          {p + off, std::min(kMaxRegisteredPiece, len - off)});
    std::sort(
        next->pieces.begin(), next->pieces.end(),
        [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
    table_ = next;
    generation = ++generation_;
    table = table_;
  }
  // Register on one ring now so that a refusal (memlock limit, unsupported
  // memory) reaches the caller instead of silently costing every write.
  std::unique_ptr<Ring> ring = NewRing();
  if (!ring) return absl::OkStatus();  // no io_uring: plain I/O needs nothing
  if (int err = -Sync(ring.get(), generation, table); err != 0) {
    Unregister(base);
    return absl::ResourceExhaustedError(
        absl::StrFormat("RegisterMemory(%p, %d): io_uring_register_buffers "
                        "failed (locked-memory limit?); "
                        "I/O from this region uses unregistered requests: %s",
                        base, len, strerror(err)));
  }
  Return(std::move(ring));
  return absl::OkStatus();
}

void RingPool::Unregister(void* base) {
  std::vector<std::unique_ptr<Ring>> idle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const Region& r) { return r.base == base; });
    if (it == regions_.end()) return;
    char* p = it->base;
    uint64_t len = it->len;
    regions_.erase(it);
    auto next = std::make_shared<RegisteredTable>();
    for (const iovec& v : table_->pieces) {
      char* b = static_cast<char*>(v.iov_base);
      if (b < p || b >= p + len) next->pieces.push_back(v);
    }
    table_ = next;
    ++generation_;
    idle.swap(idle_);
  }
  // Idle rings drop the region now: their registration pins its pages, so
  // a deleted or grown arena's memory would otherwise never be freed.
  // Outside the lock: unpinning GiBs takes a while, and Borrow may make a
  // new ring meanwhile. Return syncs each one.
  for (std::unique_ptr<Ring>& ring : idle) Return(std::move(ring));
}

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
  (void)Finish();  // an owner that wants the error calls Finish() itself
  // A ring whose submit or wait failed may hold stale entries: not reused.
  if (ring_ && !broken_) pool_->Return(std::move(ring_));
}

void IoQueue::Fail(const Request& r, int err) {
  if (!error_.ok()) return;
  if (op_ == IoOp::kRead && err == ENODATA) {
    error_ = absl::DataLossError(
        absl::StrFormat("%s: object ends before offset %d (read of %d bytes)",
                        what_, r.off + r.len, r.len));
    return;
  }
  error_ = ErrnoToStatus(
      err,
      absl::StrFormat("%s: %s of %d bytes at offset %d", what_,
                      op_ == IoOp::kWrite ? "write" : "read", r.len, r.off));
}

absl::Status IoQueue::Add(int fd, int fallback_fd, char* buf, uint64_t off,
                          uint64_t len) {
  while (len > 0 && error_.ok()) {
    uint64_t n = std::min(len, io_bytes_);
    if (ring_) {
      // A request from registered memory must not cross a piece's end.
      uint64_t room = ring_->table->RoomInPiece(buf);
      if (room > 0) n = std::min(n, room);
    }
    Request r{fd, fallback_fd, buf, off, n};
    buf += n;
    off += n;
    len -= n;
    if (!ring_) {
      RunSync(r);
      continue;
    }
    pending_.push_back(r);
    if (pending_.size() >= depth_) Pump(false);
  }
  if (ring_ && error_.ok()) Pump(false);
  return error_;
}

absl::Status IoQueue::Finish() {
  if (ring_ && !broken_) Pump(true);
  pending_.clear();
  return error_;
}

void IoQueue::RunSync(Request r) {
  while (r.len > 0) {
    ssize_t n = op_ == IoOp::kWrite ? pwrite(r.fd, r.buf, r.len, r.off)
                                    : pread(r.fd, r.buf, r.len, r.off);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0 && errno == EINVAL && r.fd != r.fallback_fd &&
        r.fallback_fd >= 0) {
      r.fd = r.fallback_fd;  // direct I/O refused this piece
      continue;
    }
    if (n < 0) return Fail(r, errno);
    if (n == 0) return Fail(r, op_ == IoOp::kWrite ? EIO : ENODATA);
    r.buf += n;
    r.off += n;
    r.len -= n;
    if ((r.off % kAlign != 0 || r.len % kAlign != 0) && r.fallback_fd >= 0)
      r.fd = r.fallback_fd;
  }
}

void IoQueue::Complete(unsigned slot, int res) {
  Request r = slots_[slot];
  free_slots_.push_back(slot);
  --inflight_;
  if (res == -EAGAIN || res == -EINTR) {
    pending_.push_front(r);
    return;
  }
  if (res < 0) return Fail(r, -res);
  if (res == 0) return Fail(r, op_ == IoOp::kWrite ? EIO : ENODATA);
  if (static_cast<uint64_t>(res) < r.len) {
    r.buf += res;
    r.off += res;
    r.len -= res;
    if ((r.off % kAlign != 0 || r.len % kAlign != 0) && r.fallback_fd >= 0)
      r.fd = r.fallback_fd;
    pending_.push_front(r);
  }
}

void IoQueue::Pump(bool wait_all) {
  io_uring* ring = &ring_->ring;
  for (;;) {
    unsigned prepared = 0;
    while (error_.ok() && inflight_ < depth_ && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) break;
      Request r = pending_.front();
      pending_.pop_front();
      unsigned slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = r;
      int index = ring_->table->Find(r.buf, r.len);
      const unsigned n = static_cast<unsigned>(r.len);
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
      ++prepared;
    }
    if (prepared > 0) {
      int ret;
      do ret = io_uring_submit(ring);
      while (ret == -EINTR || ret == -EAGAIN);
      if (ret < 0) {
        // The kernel took none of them: account them as failed.
        Fail(Request{-1, -1, nullptr, 0, 0}, -ret);
        inflight_ -= prepared;
        broken_ = true;
        return;
      }
    }
    if (inflight_ == 0) return;
    const bool room = inflight_ < depth_ && error_.ok();
    if (!wait_all && room && pending_.empty()) return;
    io_uring_cqe* cqe = nullptr;
    int ret;
    do ret = io_uring_wait_cqe(ring, &cqe);
    while (ret == -EINTR || ret == -EAGAIN);
    if (ret < 0) {
      Fail(Request{-1, -1, nullptr, 0, 0}, -ret);
      broken_ = true;
      return;
    }
    do {
      unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      Complete(slot, res);
    } while (io_uring_peek_cqe(ring, &cqe) == 0);
  }
}

}  // namespace ckpt::storage::internal
