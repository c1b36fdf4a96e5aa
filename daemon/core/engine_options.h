// The Engine's options (EngineOptions), what it reports to the
// coordinator (ShardReport, FallbackReport) and its watchdog counters
// (EngineProgress). Plain data.
#ifndef CKPT_DAEMON_CORE_ENGINE_OPTIONS_H_
#define CKPT_DAEMON_CORE_ENGINE_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/clock.h"
#include "daemon/core/metrics.h"
#include "daemon/core/ranged_slot.h"

namespace ckpt::v1 {
class TensorMeta;
}

namespace ckpt::daemon {

// A shard's progress as the coordinator hears of it (cluster mode): staged
// when committed to shared memory, durable once its file is in storage.
struct ShardReport {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  bool durable = false;
  uint64_t bytes = 0;
  uint64_t digest = 0;  // storage::ChecksumsDigest of the shard's index
  // The digest of this save's STAGED report (equal to `digest` unless the
  // persister filled in device tensors' checksums since).
  uint64_t staged_digest = 0;
  std::string key;         // storage key, when durable
  uint32_t owner_uid = 0;  // the job's uid here (its trainers' peer uid)
  // The job generation the save was made in (CommitSaveRequest.generation).
  std::optional<uint64_t> generation;
  // A save without a generation: when its trainer started (CLOCK_BOOTTIME
  // ms, PeerCreds::started_ms); 0: unknown. Sent as an age.
  int64_t trainer_started_ms = 0;
  // The save failed for good here: retracts its STAGED report.
  bool failed = false;
  // A verified copy of another node's shard that this node holds (peer
  // replicas, doc/replicas.md): reported REPLICATED, source_node sent it.
  bool replicated = false;
  std::string source_node;
  // Durable: the shard's tensor metadata and the step's world size, from
  // which the node agent builds the rank's layout index (outside the
  // engine's lock) into `layout_index` before it queues the report.
  std::shared_ptr<const std::vector<v1::TensorMeta>> metas;
  uint32_t world_size = 0;
  std::string layout_index;
};

// A rank's restore found a copy of its shard bad and fell back (what
// ReportFallback carries to the coordinator: event FALLBACK).
struct FallbackReport {
  std::string job;
  uint64_t step = 0;  // the step whose copy failed
  uint32_t rank = 0;
  std::string copy;    // the copy that failed: "memory", "file" or "object"
  std::string reason;  // why; cut to 512 bytes, unprintable bytes become '?'
  std::optional<uint64_t> next_step;  // the older step restored instead, if any
  std::string next_copy;  // the copy restored from: "memory", "file", "object"
                          // or "" (unknown)
  // Whether the daemon's own check of the copy found it bad. false: a
  // client claimed it bad but it verified, so it is kept; a node whose
  // clients keep doing that has faulty memory or a faulty device.
  bool verified_bad = true;
};

struct EngineOptions {
  std::string shm_prefix = "ckptd";  // arenas are "/<prefix>.<job>.r<rank>"
  // A hugetlbfs directory: arenas get 2 MiB pages there when it has free
  // ones, else /dev/shm (logged, and counted by the ckptd_arenas_huge_pages
  // gauge); empty: /dev/shm only. huge_required: no fallback, a
  // registration without free huge pages fails.
  std::string huge_dir;
  bool huge_required = false;
  uint32_t retain_steps = 3;  // durable steps kept per job
  uint32_t default_num_slots = 2;
  std::chrono::milliseconds default_busy_timeout = std::chrono::minutes(10);
  // While a restore's client copies out of an arena (its read lease is
  // open), the prefaulter leaves that arena's other slots unreadied, so
  // that zeroing them does not take the CPU the copy needs; for at most
  // this long from the lease's opening, so that a client that never
  // closes its lease cannot keep the next save's slot back.
  std::chrono::milliseconds prefault_read_hold = std::chrono::seconds(2);
  // A failed persist is retried, the delay doubling from
  // persist_retry_delay up to persist_retry_max_delay, for as long as the
  // shard's bytes are in memory: a storage hiccup must not lose a step
  // (only DataLoss, a slot changed after its commit, is final). After
  // max_persist_attempts failures a WaitDurable that times out says why,
  // and a newer save may take the shard's slot rather than wait for the
  // disk; the shard then fails for good.
  uint32_t max_persist_attempts = 3;
  std::chrono::milliseconds persist_retry_delay =
      std::chrono::milliseconds(200);
  std::chrono::milliseconds persist_retry_max_delay = std::chrono::seconds(30);
  // When a retry is due and the time a persist's outcome is recorded at
  // (clock.h); must outlive the Engine. A test passes a ManualClock.
  const DaemonClock* clock = DaemonClock::Real();
  uint64_t max_slot_bytes = 1ull << 40;
  uint32_t max_world_size = 1u << 20;
  // Cluster mode when non-empty: this node's id. The storage root is then
  // shared with other nodes, so this node's manifest of a step is
  // "MANIFEST.<node_id>", a step is complete here when every rank this node
  // hosts has a shard, shard files are "rank-R.<node_id>.shard", and
  // nothing is deleted by step prefix.
  std::string node_id;
  // Object tier (doc/object-tier.md), used when Open is given an object
  // backend. commit_tier says which tier makes a shard durable for
  // WaitDurable, Latest and the coordinator's reports; retain_object is
  // the number of steps kept there (0 = all); retain_steps is the local
  // tier's.
  enum class CommitTier { kLocal, kObject };
  CommitTier commit_tier = CommitTier::kLocal;
  uint32_t retain_object = 0;
  unsigned upload_threads = 4;
  // Called when a shard is committed and when it becomes durable (or
  // fails), in the order of those changes, with no lock of the engine's
  // held; it must not call the engine back.
  std::function<void(const ShardReport&)> on_shard;
  // Called, likewise, when a copy of a shard failed a restore's
  // verification.
  std::function<void(const FallbackReport&)> on_fallback;
  // A cluster's node agent: fetches saved rank `rank` of a step into this
  // node's memory from a peer holding it (its owner's slot, a replica),
  // for a restore that reads a saved rank this node does not hold
  // (NodeAgent::FetchSavedRankFromPeers). Null: none (one node). Called
  // with no lock of the engine's held; it calls Engine::FetchFromPeer.
  std::function<absl::Status(const std::string& job, uint64_t step,
                             uint32_t rank)>
      fetch_from_peers;
  // A cluster's node agent: the chunks of a saved rank that `ranges` of
  // its image touch, from a peer's memory, verified, into a slot held for
  // one read (NodeAgent::FetchSavedRangesFromPeers, doc/resharding.md,
  // "Byte ranges from a peer"). Null: none. Called likewise; it calls
  // Engine::FetchRangesFromPeer.
  std::function<absl::StatusOr<RangedSlot>(const std::string& job,
                                           uint64_t step, uint32_t rank,
                                           std::span<const ImageRange> ranges)>
      fetch_ranges_from_peers;
  // A cluster's node agent: the coordinator's layout index of a committed
  // step (NodeAgent::StepIndex: a "CKLI" blob), asked with a short
  // deadline. Null, or an error: the index is built from this node's
  // shards and the node manifests (Restorer::LayoutIndex).
  std::function<absl::StatusOr<std::string>(const std::string& job,
                                            uint64_t step)>
      step_index;
  // Where the engine counts saves, persists and restores (metrics.h); the
  // engine makes one nobody scrapes when this is null.
  std::shared_ptr<DaemonMetrics> metrics;
};

// Lock-free counters of the engine's threads, for the service watchdog
// (util/service_notify.h): the reaper ticks every 100 ms while the engine
// mutex can be taken; the persister's progress moves with each task and each
// piece of a shard written.
struct EngineProgress {
  uint64_t reaper_ticks = 0;
  uint64_t persist_progress = 0;
  bool persist_running = false;
  size_t persists_queued = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_ENGINE_OPTIONS_H_
