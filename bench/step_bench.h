// The training-step half of ckpt_optim_bench: ckpt-worker's own loop
// (Trainer), timed without checkpoints and with a SaveAsync after every step
// into a real ckptd started for the run (tests/harness.h DaemonProcess), on
// the same model. The two are timed in alternating blocks of steps so that
// drift on a shared machine hits both alike. Not thread-safe.
#ifndef CKPT_BENCH_STEP_BENCH_H_
#define CKPT_BENCH_STEP_BENCH_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/mlp_model.h"

namespace ckpt::worker {

struct StepBenchOptions {
  MlpConfig model{/*vocab=*/4096, /*dim=*/256, /*layers=*/4, /*seq=*/16,
                  /*batch=*/4};
  int blocks = 4;  // timed blocks per configuration
  int steps_per_block =
      5;  // each block ends with its last save taken by the daemon
  double offload_fraction = 0.5;
  int cpu_threads = 1;
};

struct StepTimes {
  double step_s_no_ckpt = 0;          // median over blocks, per step
  double step_s_ckpt_every_step = 0;  // idem, saving every step
  uint64_t ckpt_bytes = 0;            // bytes saved per step
};

[[nodiscard]] absl::StatusOr<StepTimes> MeasureStepTimes(
    const StepBenchOptions& options);

}  // namespace ckpt::worker

#endif  // CKPT_BENCH_STEP_BENCH_H_
