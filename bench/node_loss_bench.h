// One round of recovery_bench's node-loss figures: a cluster of
// two nodes x two ranks of cluster_trainer plus a spare (real
// ckpt-coordinator, ckptd, ckptrun; tests/cluster_harness.h) saves steps
// 1..last_step and holds. Once every rank staged the last step and the
// step before it is good (durable everywhere), and one save interval
// later (the failure comes just before the next save would), node b is
// SIGKILLed with its trainers and shared memory; the spare takes ranks 2,3
// from a live peer's memory (peer path: every node has a replica listener
// and a failure domain) or from the shared root (storage path: no
// listener, so no replicas). Then, on the same cluster once it is quiet
// again (the last step staged and durable everywhere, and every rank's
// replica on a live holder), the limit of the path: the same bytes over one
// plain TCP connection to a port of the bench's block (peer), or a raw O_DIRECT
// read of the lost shards (storage; a raw parallel GET with an object store).
// With `crash`, rank 0's trainer is then SIGKILLed on its live node the same
// way (one interval after the job staged its last step again) and restores from
// shared memory. Timings come from the coordinator's events and the trainers'
// logs, one CLOCK_MONOTONIC. Not thread-safe: one round at a time.
#ifndef CKPT_BENCH_NODE_LOSS_BENCH_H_
#define CKPT_BENCH_NODE_LOSS_BENCH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct NodeLossOptions {
  std::string dir;  // the round's cluster lives here, removed after
  uint64_t bytes_per_rank = 256 << 20;
  bool replicas = false;  // peer path; else storage path
  // The bench's port block (link_shaper.h): the plain TCP limit listens on
  // port_base, node a/b/c's replica listeners on port_base + 1/2/3.
  int port_base = 0;
  std::string object_url;  // shared root in an object store (storage path)
  uint64_t last_step = 4;
  int step_ms = 500;  // the save interval, and the wait before a kill
  bool crash = false;
};

struct CrashFigures {
  double restore_s = 0;      // rank 0's restore call
  double process_s = 0;      // its process start -> restored
  double memcpy_s = 0;       // one rank's state into faulted memory
  double all_restore_s = 0;  // the slowest of the 4 ranks' restores
  double memcpy_all_s = 0;   // 4 rank-sized memcpys at once
  uint64_t reached_step = 0;
  uint64_t restore_step = 0;
  uint64_t steps_lost = 0;
};

struct NodeLossFigures {
  bool replicas = false;
  double detect_s = 0;    // kill -> FAILURE_DETECTED
  double plan_s = 0;      // -> PLAN_MADE
  double prefetch_s = 0;  // -> PLAN_ACKED (the spare's prefetch done)
  double restart_s = 0;   // -> first trainer start (negative: before ack)
  double restore_s = 0;   // first trainer start -> last rank restored
  double recovery_s = 0;  // FAILURE_DETECTED -> every rank restored
  // FAILURE_DETECTED -> the last survivor (ranks 0,1, restored from their
  // own node's memory) / the last lost rank (2,3) restored: what every rank
  // pays anyway on this machine, and the path's own time beside it.
  double survivors_s = 0;
  double lost_ranks_s = 0;
  // The path's limit, measured after the recovery on the same cluster:
  // raw TCP of the lost bytes (peer) or the raw read of them (storage).
  double limit_s = 0;
  uint64_t lost_bytes = 0;    // per lost shard, as sent or read
  uint64_t reached_step = 0;  // newest step any rank saved before the kill
  uint64_t restore_step = 0;
  uint64_t steps_lost = 0;              // reached_step - restore_step
  uint64_t coordinator_steps_lost = 0;  // RESTORE_SOURCES.steps_lost
  std::string restore_from;             // "replica", "storage", "mixed", ...
  std::string timeline;  // the events of the recovery, for --keep / errors
  std::optional<CrashFigures> crash;
};

[[nodiscard]] absl::StatusOr<NodeLossFigures> RunNodeLossRound(
    const NodeLossOptions& options);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_NODE_LOSS_BENCH_H_
