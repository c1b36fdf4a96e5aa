// What replication costs the training step (the target: step time with
// replication on >= 97% of the speed without, i.e. on-time <= off-time
// / 0.97): ckpt-worker (the bundled trainer: a real model, the chunked
// offloaded Adam, a checkpoint save every step) as 2 nodes x 1 rank under
// ckptrun, every ckptd with a replica listener and a failure domain, and
// `--replicas 1` or `0`. The step time is read off the worker's own
// "step N loss" lines: the bench polls the logs every 2 ms and divides the
// time between the line of step `warmup` and that of step warmup + steps
// by `steps` (the poll's granularity is 2 ms over the whole window). Not
// thread-safe: one cluster at a time.
#ifndef CKPT_BENCH_REPLICATION_STEP_H_
#define CKPT_BENCH_REPLICATION_STEP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct ReplicationStepOptions {
  std::string dir;  // the cluster lives here, removed after
  bool replicas = false;
  int port_base = 0;  // node a/b's replica listeners at port_base + 1/2
  // The model: vocab 512, `layers` blocks of width `dim`, 4 sequences of 4
  // tokens a step, so that the state (12 B a parameter: weights and Adam's
  // moments; 37 MiB a rank at dim 1024) is large against the compute.
  int dim = 1024;
  int layers = 2;
  int warmup = 3;  // steps before the window (first saves create arenas)
  int steps = 20;  // steps in the window
};

struct ReplicationStepFigures {
  double step_s = 0;              // mean step time over the window
  uint64_t state_bytes = 0;       // one rank's checkpoint (from its shard file)
  uint32_t replicated_ranks = 0;  // ranks with a verified replica, at the end
};

[[nodiscard]] absl::StatusOr<ReplicationStepFigures> MeasureReplicationStep(
    const ReplicationStepOptions& options);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_REPLICATION_STEP_H_
