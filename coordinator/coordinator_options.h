// CoordinatorOptions: what a Coordinator (coordinator.h) is opened with —
// where its state and the shared root are, its timeouts, and the policies
// of hang detection, health and cordoning. Filled in one place from flags
// and the config file (options.h); plain data.
#ifndef CKPT_COORDINATOR_COORDINATOR_OPTIONS_H_
#define CKPT_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "coordinator/cordon_policy.h"
#include "coordinator/hang_model.h"
#include "coordinator/metrics.h"
#include "coordinator/suspect_policy.h"
#include "storage/backend.h"
#include "storage/object_backend.h"

namespace ckpt::coordinator {

struct CoordinatorOptions {
  std::string state_dir;    // RocksDB in <state_dir>/db
  std::string shared_root;  // global manifests go here (a directory or s3://)
  storage::ObjectStoreConfig
      object_config;  // an s3:// shared root's object_* keys
  std::chrono::milliseconds heartbeat_timeout{3000};
  // Registered nodes up to which each heartbeats every timeout / 5; past
  // it the interval grows with the cluster, at most timeout / 3
  // (heartbeat_interval.h). 0: always timeout / 5.
  uint32_t heartbeat_interval_nodes = 2048;
  // How long Open waits for a shared root whose manifests it cannot read
  // (see Open); 0: it fails at once.
  std::chrono::milliseconds shared_root_wait{30000};
  size_t max_events = 4096;  // older events are dropped from memory and disk
  // A plan whose orders are not all acknowledged this long after it was
  // made fails the nodes that did not acknowledge (a PREFETCH stuck on a
  // hung shared root) and plans again; 0: no deadline.
  std::chrono::milliseconds plan_ack_timeout{600000};
  // A node that a trainer's exit suspects (its peers there are gone) is
  // probed: asked to heartbeat at once. No heartbeat within this long: it
  // is dead, and one plan covers it and the exits that suspected it.
  std::chrono::milliseconds peer_probe_timeout{300};
  // Per job, the most steps newer than the last good one whose per-rank
  // records are kept (soft state); the oldest are dropped past it.
  size_t max_soft_steps = 64;
  // A job makes at most this many plans without a commit (its last good
  // step moving); a failure that would make one more holds it (PLAN_HELD,
  // event JOB_HELD) until an operator resumes it. 0: no limit.
  uint32_t max_failed_plans = 10;
  // The leader's fence (etcd: the election key's create revision; 0 with
  // one coordinator), recorded in every MANIFEST.global it writes and in
  // the commit that refers to it.
  uint64_t fence = 0;
  // Whether this process still leads (HA); checked right before a global
  // manifest is written. Null: always.
  std::function<bool()> leading;
  // Hang detection's timeout model (hang_model.h).
  HangPolicy hang;
  // Hang-detection evidence (stacks) kept per job: the newest this many
  // hangs.
  size_t kept_stack_generations = 8;
  // Milliseconds on a monotonic clock; tests pass a fake one.
  std::function<int64_t()> now_ms;
  // Prometheus metrics (metrics.h); Open makes one nobody scrapes when null.
  std::shared_ptr<CoordinatorMetrics> metrics;
  // Tests: wraps the shared root's backend (a fault-injection wrapper).
  std::function<std::unique_ptr<storage::Backend>(
      std::unique_ptr<storage::Backend>)>
      wrap_shared_root;
  // A node whose memcpy or CUDA bandwidth is below this fraction of the
  // cluster's median is unhealthy (health_state.h).
  double health_min_ratio = 0.5;
  // Automatic cordoning after repeated hangs and crashes on one node
  // (cordon_policy.h).
  CordonPolicy cordon;
  // A node whose restores keep claiming good copies bad is unhealthy
  // (suspect_policy.h).
  SuspectPolicy suspect;
  // A straggler's node is replaced by a spare (cordoned, reason
  // "straggler"); never when no healthy spare has room for its ranks.
  bool evict_stragglers = false;
  // A plan's trainers start once every node acknowledged its RESTART,
  // while PREFETCH orders still run (JobView.trainers_may_start); false:
  // only after every order is acknowledged.
  bool start_trainers_with_prefetch = true;
  // A spare whose newest health report is older than this is checked again
  // before it takes ranks (the plan waits for the report); 0: never. Idle
  // ckptd re-check on their own every --health-recheck-s (300), so with
  // the defaults a spare's report is always fresh and a recovery waits for
  // no check.
  int64_t spare_check_max_age_ms = 600000;
  // Elastic continuation (doc/operations.md#elastic-continuation): a job
  // that lost a node whose ranks no healthy spare takes within
  // spare_wait_ms (0: at once when no spare exists) shrinks to the largest
  // multiple of world_size_multiple its live nodes hold, never below
  // min_world_size (0: jobs never shrink; they wait for a node). A job's
  // RegisterJobRequest overrides the first two.
  uint32_t min_world_size = 0;
  uint32_t world_size_multiple = 1;
  int64_t spare_wait_ms = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_OPTIONS_H_
