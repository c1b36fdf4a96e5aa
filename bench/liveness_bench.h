// The liveness figures of recovery_bench: how fast a hang is
// found against the model's timeout, whether the defaults raise false
// hangs over a long run, and how many straggler windows a slowed rank
// takes to be named. Each runs its own cluster of real processes
// (tests/cluster_harness.h) under `dir`; timings use CLOCK_MONOTONIC, the
// clock of the coordinator's events. Not thread-safe: one run at a time.
#ifndef CKPT_BENCH_LIVENESS_BENCH_H_
#define CKPT_BENCH_LIVENESS_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

// --hang: 2 nodes x 2 ranks of cluster_trainer; rank 1's trainer is
// SIGSTOPped mid-run (alive, silent).
struct HangFigures {
  double timeout_min_s = 0;  // the coordinator's --hang-timeout-min-s
  double detect_s = 0;       // SIGSTOP -> HANG_DETECTED
  double timeout_s = 0;      // the model's timeout for the rank
  double silent_s = 0;       // the model's own "silent for"
  bool named = false;        // exactly rank 1 named
  int stacks_ranks = 0;      // ranks of its node whose stacks were kept
  int node_ranks = 0;        // trainers on that node
  bool resumed = false;      // every rank restored one step, no bad byte
  uint64_t restore_step = 0;
};
[[nodiscard]] absl::StatusOr<HangFigures> MeasureHang(const std::string& dir,
                                                      double timeout_min_s);

// --soak-s: ckpt-worker, 2 nodes x 1 rank, coordinator defaults (no hang
// flags), a save every step, a declared evaluation every 50 steps and a
// slow first step; counts what the coordinator detected meanwhile.
struct SoakOptions {
  double seconds = 600;
  double first_step_s = -1;  // < 0: min(150, seconds / 4)
  double eval_s = 10;
};
struct SoakFigures {
  double seconds = 0;
  double first_step_s = 0;
  double eval_s = 0;
  int false_hangs = 0;  // HANG_DETECTED events
  int failures = 0;     // FAILURE_DETECTED events (any restart)
  int stragglers = 0;   // STRAGGLER events
  int64_t steps = 0;    // the highest step logged
  int evals = 0;        // evaluations logged, all ranks
};
[[nodiscard]] absl::StatusOr<SoakFigures> RunSoak(const std::string& dir,
                                                  const SoakOptions& options);

// --straggler: ckpt-worker, 2 nodes x 2 ranks, rank 2 slowed by `factor`
// (--fault-slow); runs until it is named and two windows more.
struct StragglerFigures {
  double factor = 0;
  double window_s = 10;  // the coordinator's straggler window
  uint32_t rank = 0;     // the slowed rank
  bool named = false;    // a STRAGGLER event named it
  double detect_s = 0;   // its first step logged -> STRAGGLER
  // detect_s / window_s: the windows it took, the first one partial (the
  // rank started somewhere inside it).
  double windows_to_detect = 0;
  int other_stragglers = 0;  // STRAGGLER events naming another rank
};
[[nodiscard]] absl::StatusOr<StragglerFigures> MeasureStraggler(
    const std::string& dir, double factor);

// What recovery_bench was asked to run.
struct LivenessArgs {
  std::string mode;          // "hang", "soak" or "straggler"
  double timeout_min_s = 5;  // --hang-timeout-min-s of the hang mode
  SoakOptions soak;
  double slow_factor = 3;  // --slow-factor of the straggler mode
};
// Runs args.mode under `dir` and prints its figures (one JSON object with
// `json`); returns the exit code (1 with the reason on stderr).
int RunLivenessMode(const LivenessArgs& args, const std::string& dir,
                    double progress_ns, bool json);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_LIVENESS_BENCH_H_
