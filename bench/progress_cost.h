// What a progress beacon costs the trainer: Client::Progress (and the C
// API's ckpt_progress) against a real ckptd's arena, next to the limit, a
// plain release store to the same kind of memory. For recovery_bench
// --json (progress_ns) and progress_bench.
#ifndef CKPT_BENCH_PROGRESS_COST_H_
#define CKPT_BENCH_PROGRESS_COST_H_

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct ProgressCost {
  double progress_ns = 0;          // Client::Progress(step)
  double progress_compute_ns = 0;  // Client::Progress(step, compute_s)
  double c_api_ns = 0;             // ckpt_progress
  double store_ns = 0;             // one atomic release store (the limit)
};

// Starts a ckptd under `dir`, registers one rank with a small save, then
// times `calls` calls of each.
[[nodiscard]] absl::StatusOr<ProgressCost> MeasureProgressCost(
    const std::string& dir, long calls = 20'000'000);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_PROGRESS_COST_H_
