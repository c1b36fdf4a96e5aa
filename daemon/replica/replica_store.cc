// ReplicaStore (replica_store.h): the holder's copies, their budget and
// their verification.
#include "daemon/replica/replica_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "shm/huge_pages.h"
#include "storage/manifest.h"
#include "storage/shard_image.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

namespace rv1 = ::ckpt::replica::v1;

// The largest image a copy may name: as ckptd's --max-slot-bytes default.
inline constexpr uint64_t kMaxReplicaImageBytes = 1ull << 40;

struct Spare {
  char* base;
  uint64_t bytes;
};

// The store's memory: what copies hold (in flight, held, being read) and
// spare mappings, let go by their last owner and kept mapped for the next
// copy of the same size. A reused mapping's pages are already there: no
// page faults, no zeroing, no unmap per copy (a 256 MiB copy is 65,536
// faults on fresh pages). Spares count against the budget and are the
// first thing given up when a copy needs room. Shared with every
// ReplicaMemory, so a copy may outlive the store.
class ReplicaPool {
 public:
  explicit ReplicaPool(uint64_t budget) : budget_(budget) {}
  ~ReplicaPool() {
    for (const Spare& s : spares_) munmap(s.base, s.bytes);
  }

  struct Reservation {
    bool ok = false;
    char* reused = nullptr;  // a spare of the size, or null: map fresh
  };
  // Reserves `bytes`: a spare of that size when there is one, else new
  // bytes, giving up spares (moved to `unmap`, for the caller to unmap
  // outside every lock) when they do not fit otherwise.
  Reservation Reserve(uint64_t bytes, std::vector<Spare>* unmap);
  // Bytes of a mapping that was never made (mmap failed).
  void Unreserve(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes;
  }
  // The last owner let go: kept as a spare while fewer than max_spares are
  // kept, else unmapped.
  void Release(char* base, uint64_t bytes);
  // One spare per rank held, and one for a copy on the way.
  void SetMaxSpares(size_t n) {
    std::vector<Spare> unmap;
    {
      std::lock_guard<std::mutex> lock(mu_);
      max_spares_ = n;
      while (spares_.size() > max_spares_) {
        unmap.push_back(spares_.back());
        spare_bytes_ -= spares_.back().bytes;
        spares_.pop_back();
      }
    }
    Unmap(unmap);
  }
  uint64_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  uint64_t spare_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return spare_bytes_;
  }
  uint64_t reused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reused_;
  }
  static void Unmap(const std::vector<Spare>& spares) {
    for (const Spare& s : spares) munmap(s.base, s.bytes);
  }

 private:
  const uint64_t budget_;
  mutable std::mutex mu_;  // a leaf: nothing is called while it is held
  uint64_t used_ = 0;
  uint64_t spare_bytes_ = 0;
  uint64_t reused_ = 0;
  size_t max_spares_ = 1;
  std::vector<Spare> spares_;
};

ReplicaPool::Reservation ReplicaPool::Reserve(uint64_t bytes,
                                              std::vector<Spare>* unmap) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < spares_.size(); ++i) {
    if (spares_[i].bytes != bytes) continue;
    char* base = spares_[i].base;
    spares_.erase(spares_.begin() + static_cast<ptrdiff_t>(i));
    spare_bytes_ -= bytes;
    used_ += bytes;
    ++reused_;
    return {true, base};
  }
  auto fits = [&] {
    const uint64_t total = used_ + spare_bytes_;
    return total + bytes >= total && total + bytes <= budget_;
  };
  while (!fits() && !spares_.empty()) {
    unmap->push_back(spares_.back());
    spare_bytes_ -= spares_.back().bytes;
    spares_.pop_back();
  }
  if (!fits()) return {};
  used_ += bytes;
  return {true, nullptr};
}

void ReplicaPool::Release(char* base, uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= bytes;
    if (spares_.size() < max_spares_) {
      spares_.push_back({base, bytes});
      spare_bytes_ += bytes;
      return;
    }
  }
  munmap(base, bytes);
}

class ReplicaMemory {
 public:
  ReplicaMemory(char* base, uint64_t bytes, std::shared_ptr<ReplicaPool> pool)
      : base_(base), bytes_(bytes), pool_(std::move(pool)) {}
  ~ReplicaMemory() { pool_->Release(base_, bytes_); }
  char* data() { return base_; }

 private:
  char* const base_;
  const uint64_t bytes_;
  const std::shared_ptr<ReplicaPool> pool_;
};

const char* HeldReplica::data() const { return memory->data(); }

absl::Status ValidateShardCopy(const rv1::ShardCopy& copy,
                               std::string_view prefix) {
  CKPT_RETURN_IF_ERROR(
      ValidateJobName(copy.job(), absl::StrCat(std::string(prefix), "job")));
  if (copy.world_size() == 0 || copy.rank() >= copy.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(prefix), "rank: ", copy.rank(),
                     " is not below world_size ", copy.world_size()));
  if (copy.image_bytes() < 2 * storage::kShardAlign ||
      copy.image_bytes() > kMaxReplicaImageBytes ||
      copy.image_bytes() % storage::kShardAlign != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(prefix), "image_bytes: ", copy.image_bytes(),
        " is not a shard image size (a multiple of ", storage::kShardAlign,
        ", at least two, at most ", kMaxReplicaImageBytes, ")"));
  if (copy.checksums_size() == 0 ||
      static_cast<uint32_t>(copy.checksums_size()) > storage::kMaxShardTensors)
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(prefix), "checksums: ", copy.checksums_size(),
        " entries; a shard has 1 to ", storage::kMaxShardTensors, " tensors"));
  if (!copy.source_node().empty())
    CKPT_RETURN_IF_ERROR(ValidatePrintable(
        copy.source_node(), absl::StrCat(std::string(prefix), "source_node"),
        128));
  return absl::OkStatus();
}

absl::StatusOr<storage::ShardInfo> VerifyReplicaImage(
    const char* image, const rv1::ShardCopy& copy, std::string_view what) {
  CKPT_ASSIGN_OR_RETURN(
      storage::ShardInfo info,
      storage::ValidateImage({image, copy.image_bytes()},
                             {copy.job(), copy.step(), copy.rank()}, what));
  if (info.world_size != copy.world_size())
    return absl::DataLossError(absl::StrCat(std::string(what), ": world_size ",
                                            info.world_size, ", the copy says ",
                                            copy.world_size()));
  if (info.tensors.size() != static_cast<size_t>(copy.checksums_size()))
    return absl::DataLossError(
        absl::StrCat(std::string(what), ": checksums: the copy names ",
                     copy.checksums_size(), ", the image's index has ",
                     info.tensors.size(), " tensors"));
  for (size_t i = 0; i < info.tensors.size(); ++i)
    info.tensors[i].checksum = copy.checksums(static_cast<int>(i));
  CKPT_RETURN_IF_ERROR(storage::VerifyTensorChecksums(image, info, what));
  return info;
}

ReplicaStore::ReplicaStore(uint64_t budget_bytes, EvictFn on_evict)
    : budget_(budget_bytes),
      pool_(std::make_shared<ReplicaPool>(budget_bytes)),
      on_evict_(std::move(on_evict)) {
  counts_.budget_bytes = budget_bytes;
}

ReplicaStore::~ReplicaStore() = default;

absl::StatusOr<std::unique_ptr<ReplicaStore::Incoming>> ReplicaStore::Begin(
    const rv1::ShardCopy& copy) {
  CKPT_RETURN_IF_ERROR(ValidateShardCopy(copy, "copy."));
  const uint64_t bytes = copy.image_bytes();
  {
    // A copy of a later life of the job on its source node: the job was
    // deleted there and registered again. Its earlier life's copies (every
    // rank's) are of a job that is gone: they go, and are withdrawn.
    std::vector<std::shared_ptr<const HeldReplica>> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (absl::Status st = LifeRefusalLocked(copy); !st.ok()) {
        ++counts_.refused;
        return st;
      }
      DropEarlierLivesLocked(copy, &gone);
    }
    for (const auto& g : gone)
      LogInfo(absl::StrCat("replica of job '", g->copy.job(), "' step ",
                           g->copy.step(), " rank ", g->copy.rank(), " from ",
                           g->copy.source_node(),
                           " dropped: the job was deleted there and "
                           "registered again"));
    if (on_evict_)
      for (const auto& g : gone) on_evict_(g->copy);
  }
  // Two tries: when the copy does not fit, spares go first, then previous
  // copies (this rank's first: the one this copy makes obsolete), released
  // outside the lock, and the reservation is tried once more.
  ReplicaPool::Reservation got;
  for (int attempt = 0;; ++attempt) {
    std::vector<std::shared_ptr<const HeldReplica>> dropped;
    std::vector<Spare> unmap;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = held_.find({copy.job(), copy.rank()}); it != held_.end())
        if (absl::Status st = RefusalLocked(it->second, copy); !st.ok()) {
          ++counts_.refused;
          return st;
        }
      got = pool_->Reserve(bytes, &unmap);
      if (!got.ok) {
        const uint64_t used = pool_->used();
        if (attempt == 0)
          DropPreviousLocked(
              copy.job(), copy.rank(),
              used + bytes < used ? UINT64_MAX : used + bytes - budget_,
              &dropped);
        if (dropped.empty()) {
          ++counts_.refused;
          ReplicaPool::Unmap(unmap);
          return absl::ResourceExhaustedError(absl::StrCat(
              "replica_memory_bytes: ", bytes, " more bytes do not fit: ", used,
              " of ", budget_, " are in use (held, arriving or being read)"));
        }
      }
    }
    ReplicaPool::Unmap(unmap);
    for (const auto& d : dropped)
      LogInfo(absl::StrCat("replica of job '", d->copy.job(), "' step ",
                           d->copy.step(), " rank ", d->copy.rank(), " from ",
                           d->copy.source_node(), " dropped for room (step ",
                           copy.step(), " rank ", copy.rank(), " arriving)"));
    // Dropped copies are retracted like replaced ones: the coordinator
    // must not name them as sources.
    if (on_evict_)
      for (const auto& d : dropped) on_evict_(d->copy);
    if (got.ok) break;
    // `dropped` lets go here: their mappings become spares, one of which
    // the next try may take.
  }
  char* base = got.reused;
  if (base == nullptr) {
    // Fresh pages, 2 MiB each where THP allows: one fault and one
    // page-table entry per 2 MiB is most of what receiving costs.
    void* fresh = shm::MapHugeAnonymous(bytes);
    if (fresh == MAP_FAILED) {
      const int err = errno;
      pool_->Unreserve(bytes);
      return absl::ResourceExhaustedError(
          absl::StrCat("replica_memory_bytes: mapping ", bytes,
                       " bytes: ", std::strerror(err)));
    }
    base = static_cast<char*>(fresh);
  }
  auto memory = std::make_shared<ReplicaMemory>(base, bytes, pool_);
  return std::unique_ptr<Incoming>(new Incoming(this, copy, std::move(memory)));
}

ReplicaStore::Incoming::~Incoming() = default;

char* ReplicaStore::Incoming::data() { return memory_->data(); }

absl::StatusOr<std::shared_ptr<const HeldReplica>>
ReplicaStore::Incoming::Commit() {
  const std::string what =
      absl::StrCat("replica of job '", copy_.job(), "' step ", copy_.step(),
                   " rank ", copy_.rank());
  absl::StatusOr<storage::ShardInfo> info =
      VerifyReplicaImage(memory_->data(), copy_, what);
  std::vector<std::shared_ptr<const HeldReplica>> evicted;
  std::shared_ptr<HeldReplica> held;
  size_t max_spares = 0;
  {
    std::lock_guard<std::mutex> lock(store_->mu_);
    if (!info.ok()) {
      ++store_->counts_.rejected;
      memory_.reset();
      return info.status();
    }
    Copies& rank = store_->held_[{copy_.job(), copy_.rank()}];
    if (absl::Status st = store_->RefusalLocked(rank, copy_); !st.ok()) {
      ++store_->counts_.refused;
      memory_.reset();
      return absl::Status(st.code(),
                          absl::StrCat(std::string(what),
                                       ": arrived meanwhile: ", st.message()));
    }
    held = std::make_shared<HeldReplica>();
    held->copy = copy_;
    held->digest = storage::ChecksumsDigest(*info);
    held->memory = std::move(memory_);
    // Another save of a step held replaces that copy: one copy per step.
    auto same_step = [&](const std::shared_ptr<const HeldReplica>& c) {
      return c && c->copy.step() == copy_.step();
    };
    if (same_step(rank.newest)) {
      evicted.push_back(std::move(rank.newest));
      rank.newest = std::move(rank.previous);
      rank.previous = nullptr;
    } else if (same_step(rank.previous)) {
      evicted.push_back(std::move(rank.previous));
      rank.previous = nullptr;
    }
    // The newest copy stays as the previous one: a step every rank of the
    // sender has in memory survives one rank's newer copy arriving first.
    if (rank.previous) evicted.push_back(std::move(rank.previous));
    rank.previous = std::move(rank.newest);
    rank.newest = held;
    ++store_->counts_.verified;
    store_->counts_.evicted += evicted.size();
    max_spares = store_->held_.size() + 1;
  }
  store_->pool_->SetMaxSpares(max_spares);
  if (store_->on_evict_)
    for (const auto& e : evicted) store_->on_evict_(e->copy);
  return std::shared_ptr<const HeldReplica>(std::move(held));
}

namespace {

bool SameSave(const rv1::ShardCopy& a, const rv1::ShardCopy& b) {
  return a.source_node() == b.source_node() && a.step() == b.step() &&
         a.generation() == b.generation() &&
         a.image_bytes() == b.image_bytes() &&
         std::equal(a.checksums().begin(), a.checksums().end(),
                    b.checksums().begin(), b.checksums().end());
}

}  // namespace

absl::Status ReplicaStore::LifeRefusalLocked(const rv1::ShardCopy& copy) const {
  auto it = lives_.find({copy.job(), copy.source_node()});
  if (copy.job_life() == 0 || it == lives_.end() ||
      it->second <= copy.job_life())
    return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "copy.job_life: job '", copy.job(), "' rank ", copy.rank(), " step ",
      copy.step(), " from ", copy.source_node(), " is of life ",
      copy.job_life(), ", which was deleted there: the job's life there is ",
      it->second));
}

void ReplicaStore::DropEarlierLivesLocked(
    const rv1::ShardCopy& copy,
    std::vector<std::shared_ptr<const HeldReplica>>* dropped) {
  if (copy.job_life() == 0) return;
  uint64_t& life = lives_[{copy.job(), copy.source_node()}];
  if (life >= copy.job_life()) return;
  life = copy.job_life();
  auto earlier = [&](const std::shared_ptr<const HeldReplica>& c) {
    return c && c->copy.source_node() == copy.source_node() &&
           c->copy.job_life() != 0 && c->copy.job_life() < copy.job_life();
  };
  for (auto it = held_.lower_bound({copy.job(), 0});
       it != held_.end() && it->first.first == copy.job();) {
    Copies& c = it->second;
    for (auto* slot : {&c.newest, &c.previous})
      if (earlier(*slot)) {
        dropped->push_back(std::move(*slot));
        *slot = nullptr;
        ++counts_.evicted;
      }
    if (!c.newest) c.newest = std::move(c.previous);
    it = c.newest ? std::next(it) : held_.erase(it);
  }
}

absl::Status ReplicaStore::RefusalLocked(const Copies& held,
                                         const rv1::ShardCopy& copy) const {
  CKPT_RETURN_IF_ERROR(LifeRefusalLocked(copy));
  for (const auto& c : {held.newest, held.previous})
    if (c && SameSave(c->copy, copy))
      return absl::AlreadyExistsError(absl::StrCat(
          "copy: job '", copy.job(), "' step ", copy.step(), " rank ",
          copy.rank(), " from ", copy.source_node(), " is held already"));
  if (!held.newest) return absl::OkStatus();
  // Only the node that sent the newest copy is judged by its order: a
  // copy another node claims for the rank, however high, never keeps out
  // the copies of the node the rank is on now.
  // Nor is another life of the job there (a life 0 is unknown: an older
  // sender's copy, judged by the order).
  const rv1::ShardCopy& newest = held.newest->copy;
  const bool same_life = newest.job_life() == copy.job_life() ||
                         newest.job_life() == 0 || copy.job_life() == 0;
  if (newest.source_node() == copy.source_node() && same_life &&
      std::make_pair(newest.generation(), newest.step()) >
          std::make_pair(copy.generation(), copy.step()))
    return absl::FailedPreconditionError(absl::StrCat(
        "copy.step: job '", copy.job(), "' rank ", copy.rank(), " step ",
        copy.step(), " generation ", copy.generation(), " from ",
        copy.source_node(), " is older than the copy it sent before (step ",
        newest.step(), " generation ", newest.generation(), ")"));
  return absl::OkStatus();
}

std::shared_ptr<const HeldReplica> ReplicaStore::Find(const std::string& job,
                                                      uint64_t step,
                                                      uint32_t rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = held_.find({job, rank});
  if (it == held_.end()) return nullptr;
  for (const auto& c : {it->second.newest, it->second.previous})
    if (c && c->copy.step() == step) return c;
  return nullptr;
}

void ReplicaStore::DropPreviousLocked(
    const std::string& job, uint32_t rank, uint64_t need,
    std::vector<std::shared_ptr<const HeldReplica>>* dropped) {
  uint64_t freed = 0;
  auto drop = [&](Copies& c) {
    if (!c.previous || freed >= need) return;
    freed += c.previous->copy.image_bytes();
    dropped->push_back(std::move(c.previous));
    c.previous = nullptr;
    ++counts_.evicted;
  };
  auto own = held_.find({job, rank});
  if (own != held_.end()) drop(own->second);
  // Then the other ranks' previous copies, oldest step first.
  std::vector<Copies*> others;
  for (auto& [key, c] : held_)
    if (c.previous) others.push_back(&c);
  std::sort(others.begin(), others.end(), [](Copies* a, Copies* b) {
    return a->previous->copy.step() < b->previous->copy.step();
  });
  for (Copies* c : others) drop(*c);
}

ReplicaStats ReplicaStore::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReplicaStats s = counts_;
  s.used_bytes = pool_->used();
  s.spare_bytes = pool_->spare_bytes();
  s.reused = pool_->reused();
  for (const auto& [key, c] : held_)
    s.held += (c.newest ? 1 : 0) + (c.previous ? 1 : 0);
  return s;
}

}  // namespace ckpt::daemon
