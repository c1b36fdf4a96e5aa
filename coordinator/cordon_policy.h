// When a node is cordoned automatically: the incidents — hangs
// of a rank it hosts, crashes of its trainers, restores on it that claimed
// good copies bad once it is suspect (suspect_policy.h) — charged to each
// node, and the rule that turns them into a cordon. Pure state over a clock
// value: no lock, no I/O, tested alone. Not thread-safe (the coordinator holds
// its state mutex).
//
// One incident per (job, generation) and node: the first failure of a
// generation makes a plan, and what the launchers report of that
// generation afterwards (a second trainer of the node exiting, the hang
// of the same ranks) is the same incident. A node is due for a cordon once
// `after` incidents fall within the last `window_s` seconds.
#ifndef CKPT_COORDINATOR_CORDON_POLICY_H_
#define CKPT_COORDINATOR_CORDON_POLICY_H_

#include <cstdint>
#include <deque>
#include <string>

namespace ckpt::coordinator {

struct CordonPolicy {
  // Defaults a user need not change (doc/operations.md says why).
  int after = 3;           // --cordon-after; 0: never automatically
  double window_s = 1800;  // --cordon-window-s
};

// What an incident was, for the cordon's reason.
enum class IncidentKind { kFailure, kSuspectRestore };

class IncidentLog {
 public:
  // Records an incident of `job`'s `generation` at now_ms (unless that
  // generation already has one here) and forgets those older than the
  // window. Returns the incidents within the window, this one included.
  int Add(const CordonPolicy& policy, int64_t now_ms, const std::string& job,
          uint64_t generation, IncidentKind kind = IncidentKind::kFailure);
  // The incidents of `kind` within the window (as of the last Add).
  int Count(IncidentKind kind) const;
  // Whether `count` incidents make a node due for a cordon.
  static bool Due(const CordonPolicy& policy, int count) {
    return policy.after > 0 && count >= policy.after;
  }
  void Clear() { incidents_.clear(); }

 private:
  struct Incident {
    int64_t ms = 0;
    std::string job;
    uint64_t generation = 0;
    IncidentKind kind = IncidentKind::kFailure;
  };
  std::deque<Incident> incidents_;  // oldest first
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CORDON_POLICY_H_
