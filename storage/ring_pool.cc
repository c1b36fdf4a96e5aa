#include "storage/ring_pool.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace ckpt::storage {

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

}  // namespace ckpt::storage
