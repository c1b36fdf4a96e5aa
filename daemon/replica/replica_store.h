// ReplicaStore: the holder's side of peer replicas (doc/replicas.md). It
// keeps, per (job, rank) of another node, the two newest verified copies of
// the rank's shard in this daemon's own shared memory (one anonymous shared
// mapping per copy), within a byte budget (--replica-memory-bytes). Two, as
// the sender's arena holds two slots per rank: when a node dies while its
// ranks' newest copies are on the way, the step before is still here for
// every rank. The previous copies are what gives way to a copy that does
// not fit (the arriving rank's own first, then the oldest steps').
//
// A copy arrives through an Incoming: Begin reserves its bytes against the
// budget (refused, naming replica_memory_bytes, when they do not fit: the
// sender tries again later or the coordinator places it elsewhere), the
// caller writes the image into it, and Commit verifies it with storage/'s
// one validator and checksum verifier (the image's header, index and
// footer, then every tensor against the checksums the copy names) before it
// replaces the rank's older copy. A copy that fails is dropped and never
// counted. A copy of a step held replaces that copy (another save of the
// step). A copy names the job's life on its source node (when the job was
// registered there): a later life is the job deleted and registered again,
// and every copy of its earlier lives from that node goes (withdrawn like
// any copy that goes); a copy of an earlier life is refused. Copies from the
// node that sent the rank's newest copy must be newer by (generation, step):
// after a rollback a smaller step of a newer generation replaces a larger one,
// and a late older save never replaces a newer one. A copy from another node is
// not judged by that order: the rank's copies come from whichever node hosts it
// now, and a claim another node makes (any generation, any step) must never
// keep them out. What the coordinator may name is its business: it checks every
// copy against the save it recorded. Every copy that goes (replaced, or dropped
// for room) is handed to the eviction hook, so that its holder retracts it.
//
// Bytes are counted from Begin until the last owner (a Get streaming it)
// lets go of an evicted copy. Its mapping is then kept as a spare for the
// next copy of that size (one spare per rank held, one more for a copy on
// the way): its pages are already there, so a copy costs no page faults,
// zeroing or unmap. Spares count against the budget too and are the first
// to go when a copy needs room: the budget bounds the memory really held.
//
// Thread-safety: all methods are safe to call concurrently; the store's
// mutex guards bookkeeping only, never held while bytes are copied or
// verified.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_STORE_H_
#define CKPT_DAEMON_REPLICA_REPLICA_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "replica.pb.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

// One copy's memory: an anonymous shared mapping, given back to the
// store's pool (kept as a spare, or unmapped) when the last owner lets go.
class ReplicaMemory;
// The store's byte count and its spare mappings (replica_store.cc).
class ReplicaPool;

// A verified copy. The mapping lives as long as the shared_ptr.
struct HeldReplica {
  replica::v1::ShardCopy copy;
  uint64_t digest = 0;  // storage::ChecksumsDigest of copy.checksums
  std::shared_ptr<ReplicaMemory> memory;
  const char* data() const;
};

struct ReplicaStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;  // held, in flight and still being read
  // Mappings kept for the next copy of their size (within the budget, the
  // first to go when a copy needs room), and how many copies took one.
  uint64_t spare_bytes = 0;
  uint64_t reused = 0;
  uint32_t held = 0;
  uint64_t verified = 0;  // copies that verified and were kept
  uint64_t rejected = 0;  // copies that failed verification
  uint64_t refused = 0;   // Begin refused: over budget or older
  uint64_t evicted = 0;   // replaced by newer copies, or dropped for room
};

class ReplicaStore {
 public:
  // A copy that went (replaced, or dropped for room): its holder retracts
  // it. Called with no lock held.
  using EvictFn = std::function<void(const replica::v1::ShardCopy&)>;

  explicit ReplicaStore(uint64_t budget_bytes, EvictFn on_evict = nullptr);
  ReplicaStore(const ReplicaStore&) = delete;
  ReplicaStore& operator=(const ReplicaStore&) = delete;
  ~ReplicaStore();

  class Incoming {
   public:
    ~Incoming();
    char* data();
    uint64_t size() const { return copy_.image_bytes(); }
    const replica::v1::ShardCopy& copy() const { return copy_; }
    // Verifies the image and keeps it as the rank's newest copy (the newest
    // becomes the previous one; the previous one goes). DataLoss naming the
    // field or tensor when it fails; the copy is then dropped.
    // As Begin's refusals when another copy was kept meanwhile.
    [[nodiscard]] absl::StatusOr<std::shared_ptr<const HeldReplica>> Commit();

   private:
    friend class ReplicaStore;
    Incoming(ReplicaStore* store, replica::v1::ShardCopy copy,
             std::shared_ptr<ReplicaMemory> memory)
        : store_(store), copy_(std::move(copy)), memory_(std::move(memory)) {}
    ReplicaStore* store_;
    replica::v1::ShardCopy copy_;
    std::shared_ptr<ReplicaMemory> memory_;
  };

  // Validates the copy's description (fields named) and reserves its bytes.
  // ResourceExhausted naming replica_memory_bytes when they do not fit;
  // AlreadyExists when the store holds this save; FailedPrecondition when
  // it holds a newer copy from the same source node.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Incoming>> Begin(
      const replica::v1::ShardCopy& copy);
  // The held copy of (job, step, rank), or null.
  std::shared_ptr<const HeldReplica> Find(const std::string& job, uint64_t step,
                                          uint32_t rank) const;
  ReplicaStats Stats() const;

 private:
  const uint64_t budget_;
  // Shared with every ReplicaMemory, which gives its mapping back to it.
  const std::shared_ptr<ReplicaPool> pool_;
  const EvictFn on_evict_;
  mutable std::mutex mu_;
  struct Copies {
    std::shared_ptr<const HeldReplica> newest;  // never null once kept
    std::shared_ptr<const HeldReplica> previous;
  };
  // Why `copy` may not be kept beside (or in place of) `held`, or OK.
  absl::Status RefusalLocked(const Copies& held,
                             const replica::v1::ShardCopy& copy) const;
  // FailedPrecondition naming job_life when `copy` is of an earlier life
  // of the job on its source node than one seen (a deleted one).
  absl::Status LifeRefusalLocked(const replica::v1::ShardCopy& copy) const;
  // When `copy` is of a later life of its job on its source node than any
  // seen: moves every held copy of the earlier lives from that node (all
  // ranks) into `dropped`, released and withdrawn by the caller without
  // the lock, and remembers the life.
  void DropEarlierLivesLocked(
      const replica::v1::ShardCopy& copy,
      std::vector<std::shared_ptr<const HeldReplica>>* dropped);
  // Moves previous copies of `need` bytes or more (the rank's own first,
  // then other ranks', oldest step first) into `dropped`, which the caller
  // releases without the lock.
  void DropPreviousLocked(
      const std::string& job, uint32_t rank, uint64_t need,
      std::vector<std::shared_ptr<const HeldReplica>>* dropped);
  std::map<std::pair<std::string, uint32_t>, Copies> held_;
  // By (job, source node): the latest life of the job seen from there
  // (ShardCopy.job_life). Kept after the copies go, so that a late copy
  // of a deleted life is still refused; one entry per job and sender.
  std::map<std::pair<std::string, std::string>, uint64_t> lives_;
  ReplicaStats counts_;
};

// Checks a copy's image against the copy (every byte of image_bytes is
// the image): storage::ValidateImage (header, index, footer, the shard
// named), then every tensor's bytes against copy.checksums
// (storage::VerifyTensorChecksums). Returns the index with those
// checksums. DataLoss naming `what` and the field or tensor.
[[nodiscard]] absl::StatusOr<storage::ShardInfo> VerifyReplicaImage(
    const char* image, const replica::v1::ShardCopy& copy,
    std::string_view what);

// The shard a copy names, validated: job name, rank < world_size, sizes
// within limits. InvalidArgument naming `prefix` + the field.
[[nodiscard]] absl::Status ValidateShardCopy(const replica::v1::ShardCopy& copy,
                                             std::string_view prefix);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_STORE_H_
