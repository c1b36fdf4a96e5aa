// Replicator: the sending half of peer replicas, the pipeline's replicate
// stage (doc/replicas.md). For every rank this node hosts it sends the
// newest staged shard to the node's replica target (the coordinator's
// HeartbeatResponse.replica_target, or a fixed --replica-target), where
// the holder verifies it before it reports REPLICATED.
//
// It has its own queue and one thread. Staged() (the engine's on_shard
// hook, called with the job table's lock held) only records the rank's
// newest step and wakes the thread: a save never waits for a replica.
// The thread takes a StagedShards snapshot (under the table's lock, for
// the bookkeeping only), streams the slot's bytes with no lock and no
// lease, and then asks whether a save overwrote the slot meanwhile: such a
// copy is abandoned (the newer save is queued by then); a send in flight
// is cancelled when the target changes. A sender slower than two saves
// (the slot is the next-but-one save's) completes no copy at all: counted
// per job (ckptd_replica_sends_overwritten_total) and warned about per
// rank (warn_overwritten_after). Sends are paced by
// the rate limit (--replica-bandwidth); a failed send (the holder down,
// stopped, out of room, or a copy damaged on the way) is retried with
// exponential backoff, capped, for as long as it is the rank's newest; a
// refusal for want of room, or because the holder keeps a copy of the
// rank it takes for newer, is also reported (Refused) so that the
// coordinator names another target; a copy the holder has already counts
// as done, not as sent. A new target re-sends every rank's
// newest shard.
//
// Thread-safety: all methods are safe to call concurrently; the mutex is
// never held across a transfer or a call into StagedShards.
#ifndef CKPT_DAEMON_REPLICA_REPLICATOR_H_
#define CKPT_DAEMON_REPLICA_REPLICATOR_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "coordinator/client/tls.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/staged_shards.h"

namespace ckpt::daemon {

struct ReplicaPeer {
  std::string node_id;
  std::string host;
  uint32_t port = 0;
  bool operator==(const ReplicaPeer&) const = default;
};

struct ReplicatorOptions {
  std::string node_id;  // this node (the copies' source_node)
  coordinator::TlsFiles tls;
  uint64_t bandwidth = 0;  // bytes/s, 0: unlimited
  std::chrono::milliseconds retry_delay{200};
  std::chrono::milliseconds max_retry_delay{std::chrono::seconds(10)};
  bool corrupt = false;  // test-only: PutOptions::corrupt
  ReplicaTransport transport = ReplicaTransport::kBulk;  // --replica-transport
  // A send fails after this long plus twice its time at the rate limit (or
  // at 100 MB/s), so that a stopped holder costs one try, not the stage.
  std::chrono::milliseconds put_deadline{std::chrono::seconds(10)};
  // A rank whose copies were overwritten (a save took the slot while it
  // was sent) this many times in a row, none completed, is warned about:
  // once, until a copy of it completes. 0: never.
  uint32_t warn_overwritten_after = 3;
};

// The target's refusal of this node's copies, for want of room (its
// --replica-memory-bytes) or because it keeps a copy of the rank it takes
// for newer: the node agent tells the coordinator, which places them
// elsewhere (HeartbeatRequest.replica_refused).
struct HolderRefusal {
  std::string holder;  // the target's node id
  std::string reason;  // its words, naming the field
};

struct ReplicatorStats {
  uint64_t sent = 0;  // copies the holder verified
  uint64_t sent_bytes = 0;
  uint64_t failed = 0;       // attempts that failed (each retried)
  uint64_t overwritten = 0;  // abandoned: a save took the slot meanwhile
  std::map<std::string, uint64_t> overwritten_by_job;  // the same, per job
  uint64_t overwritten_warnings = 0;  // runs warned about (one per rank)
  uint32_t pending = 0;  // ranks whose newest shard is not at the target
  std::string last_error;
};

class Replicator {
 public:
  explicit Replicator(ReplicatorOptions options);
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;
  ~Replicator();  // Stop()

  // Copies are read from `staged` (the engine), which must outlive the
  // replicator. The replicator exists before the engine it reads, so the
  // engine's reports can name it from its first one.
  void Start(StagedShards* staged);
  void Stop();  // abandons queued copies and cancels the one in flight

  // The rank's shard of `step` was committed (durable false: it is the
  // rank's newest from now on) or became durable (its checksums are now
  // all known; ignored unless it is still the rank's newest). Before
  // Start (the engine's recovery) it is ignored: a recovered shard is
  // replicated with the rank's next save.
  void Staged(const std::string& job, uint64_t step, uint32_t rank,
              bool durable = false);
  // Where copies go from now on; nullopt: nowhere. A new target gets every
  // rank's newest shard; a copy in flight to the old one is cancelled (a
  // stopped holder would hold it until its deadline).
  void SetTarget(std::optional<ReplicaPeer> target);
  // Set while the current target's last answer was a refusal: "no room"
  // (ResourceExhausted naming replica_memory_bytes) or "holds a newer
  // copy" (FailedPrecondition naming copy.step).
  std::optional<HolderRefusal> Refused() const;
  ReplicatorStats Stats() const;

 private:
  struct Rank {
    uint64_t step = 0;
    bool done = false;     // the target holds this step (verified)
    bool waiting = false;  // done until its checksums are known
    uint32_t attempts = 0;
    std::chrono::steady_clock::time_point not_before{};
    // Copies overwritten in a row since one of this rank last completed,
    // and whether that run was warned about.
    uint32_t overwritten_run = 0;
    bool warned = false;
  };
  using Key = std::pair<std::string, uint32_t>;  // (job, rank)

  void Loop();
  // The next due rank, or nullopt (then *wait_until says until when).
  std::optional<Key> NextLocked(std::chrono::steady_clock::time_point* wake);
  void SendOne(const Key& key, uint64_t step, const ReplicaPeer& target);

  const ReplicatorOptions options_;
  StagedShards* staged_ = nullptr;  // set by Start, before the thread
  RateLimiter limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::optional<ReplicaPeer> target_;
  std::shared_ptr<grpc::Channel> channel_;  // to target_
  std::map<Key, Rank> ranks_;
  std::optional<HolderRefusal> refused_;  // by target_
  TransferCancel cancel_;  // of the send in flight; reset under mu_
  ReplicatorStats stats_;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICATOR_H_
