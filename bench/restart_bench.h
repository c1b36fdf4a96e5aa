// One round of recovery_bench's restart figures: a job of ckpt-worker
// ranks (2 nodes x 2 ranks, a small model: this is about restart time,
// not bytes) under real ckptruns, ckptds and a ckpt-coordinator
// (tests/cluster_harness.h), with `warm` warm processes per ckptrun.
//  1. Rank 1's trainer is SIGKILLed once the job has a good checkpoint:
//     kill -> every survivor's first step after the restore (they keep
//     their processes: an in-process restart) and -> the killed rank's
//     first step (its replacement: a warm process, or one started anew
//     when warm is 0). Beside them the job's undisturbed step time.
//  2. With `node_loss`, later, node b (ranks 2,3) is SIGKILLed whole: its
//     ckptd, ckptrun and trainers. kill -> the coordinator declares b dead
//     (the survivors' broken collectives report the lost peer, the
//     coordinator probes b), against the heartbeat timeout (what detection
//     takes when no peer sees the death); kill -> every rank's first step
//     on the spare c.
// Plans: PLAN_MADE events per failure, counted once the job trained past
// the moment a heartbeat timeout would have planned again. Every time
// comes from the coordinator's events and the trainers' step lines
// (ckpt-worker --log-mono), one CLOCK_MONOTONIC. Not thread-safe.
#ifndef CKPT_BENCH_RESTART_BENCH_H_
#define CKPT_BENCH_RESTART_BENCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct RestartOptions {
  std::string dir;  // the round's cluster lives here
  int warm = 1;     // ckptrun --warm on every node (0: replacements cold)
  bool node_loss = true;
  int heartbeat_timeout_ms = 2000;
};

struct RestartFigures {
  int warm = 0;
  double load_1m = 0;  // /proc/loadavg's first figure at the trainer kill
  double step_s = 0;   // the undisturbed step, median before the kill
  // Trainer killed.
  double survivors_s = 0;    // kill -> the last survivor's first step
  double replacement_s = 0;  // kill -> the killed rank's first step
  int survivors = 0;
  int kept = 0;                   // survivors whose ckptrun kept their process
  bool replacement_warm = false;  // placed in a warm process
  // Node lost (node_loss).
  double suspected_s = -1;  // kill -> first PEER_SUSPECTED (-1: none)
  double detect_s = 0;      // kill -> FAILURE_DETECTED of node b
  bool detected_by_probe = false;
  double node_first_step_s = 0;  // kill -> every rank's first step
  int node_kept = 0;             // node a's ranks kept
  double node_load_1m = 0;
  int failures = 0;
  int plans = 0;  // PLAN_MADE events
  std::string timeline;
};

[[nodiscard]] absl::StatusOr<RestartFigures> RunRestartRound(
    const RestartOptions& options);

// recovery_bench's keys for the rounds ("key":value pairs joined by
// commas, no braces) and its table rows (bench/restart_report.cc): warm
// rounds (--warm 1, with a node loss), cold ones (--warm 0), and the
// heartbeat timeout they ran under.
std::string RestartJsonFields(const std::vector<RestartFigures>& warm,
                              const std::vector<RestartFigures>& cold,
                              int heartbeat_ms);
std::string RestartText(const std::vector<RestartFigures>& warm,
                        const std::vector<RestartFigures>& cold,
                        int heartbeat_ms);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_RESTART_BENCH_H_
