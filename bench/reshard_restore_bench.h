// The resharding figures (bench/reshard_restore_bench.cc): N ranks save
// o.bytes of float32 tensors row-sharded over them; then, interleaved over
// o.repeat rounds, M ranks restore the rows an M-way split gives them
// against the N ranks restoring their own pieces, from memory, from disk
// after a cold restart and, with o.object_url, from the object store after
// a restart with the local shard files gone. Used by ckpt_bench --reshard
// and recovery_bench (its "reshard" object). Not thread-safe.
#ifndef CKPT_BENCH_RESHARD_RESTORE_BENCH_H_
#define CKPT_BENCH_RESHARD_RESTORE_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "bench/ckpt_bench.h"

namespace ckpt::bench {

// Medians of the sums of every rank's Restore call, in seconds.
struct ReshardFigures {
  int saved_ranks = 0, restored_ranks = 0, tensors = 0, rounds = 0;
  uint64_t bytes = 0;
  double same_layout_restore_s = 0, reshard_restore_s = 0;  // memory
  double disk_same_layout_restore_s = 0, disk_reshard_restore_s = 0;
  bool object = false;  // the object tier was measured
  double object_same_layout_restore_s = 0, object_reshard_restore_s = 0;
  double plan_s = 0;  // one PlanReshard of every restoring rank's pieces
  bool restore_matches = false;  // every restore equal to the saved bytes
};

// Starts its own ckptd under o.root (default /var/tmp) and measures.
[[nodiscard]] absl::StatusOr<ReshardFigures> MeasureReshard(const Options& o,
                                                            int saved,
                                                            int restored);
// The figures as JSON members ("key": value, comma-separated, no braces).
std::string ReshardJsonFields(const ReshardFigures& f);
// The figures as a table with the ratios.
std::string ReshardText(const ReshardFigures& f);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_RESHARD_RESTORE_BENCH_H_
