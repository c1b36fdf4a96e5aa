// When a node is suspect (health_state.h's verdict): the restores on it
// that claimed a copy bad while the node's own check found the copy good
// (a FALLBACK report with verified_bad false; the node kept the copy). One
// such claim can be a client's bug; a node that keeps making them reads
// good bytes wrong — faulty memory, a faulty GPU — whatever its checks
// say. `after` claims within the last `window_s` seconds make it suspect:
// the coordinator puts a failed check kSuspectCheck in its health report,
// judged like any other failed check. Claims never destroy data; the
// verdict only keeps ranks off the node. Pure state over a clock value: no
// lock, no I/O, tested alone. Not thread-safe (the coordinator holds its
// state mutex).
#ifndef CKPT_COORDINATOR_SUSPECT_POLICY_H_
#define CKPT_COORDINATOR_SUSPECT_POLICY_H_

#include <cstdint>
#include <deque>

#include "coordinator.pb.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

struct SuspectPolicy {
  // Defaults a user need not change (doc/operations.md says why).
  int after = 3;           // --suspect-after-claims; 0: never
  double window_s = 1800;  // --suspect-claims-window-s
};

// The check a suspect node's health report carries.
inline constexpr char kSuspectCheck[] = "restore_claims";

class ClaimLog {
 public:
  // Records a claim at now_ms and forgets those older than the window.
  // Returns the claims within the window, this one included.
  int Add(const SuspectPolicy& policy, int64_t now_ms);
  // Whether `count` claims make a node suspect.
  static bool Due(const SuspectPolicy& policy, int count) {
    return policy.after > 0 && count >= policy.after;
  }
  void Clear() { ms_.clear(); }

 private:
  std::deque<int64_t> ms_;  // oldest first
};

// The failed kSuspectCheck for `count` claims within the policy's window.
v1::HealthCheck SuspectCheck(const SuspectPolicy& policy, int count);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SUSPECT_POLICY_H_
