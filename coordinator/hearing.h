// Hearing: what the coordinator could hear, so that liveness is judged on
// it. A node is dead when the coordinator, able to hear, heard nothing
// from it for the heartbeat timeout; time during which the coordinator
// itself could not hear (the state loading after a failover, a process so
// starved that its failure detector woke late, heartbeats it had to shed)
// is not held against anyone: every node's window restarts when hearing
// recovers (RestartWindows). Heartbeats that admission sheds are still
// heard (their node's last-seen time moves before the call is refused), so
// shedding is only counted here.
//
// Bound: a node that dies while the coordinator hears is declared dead
// within timeout + one tick, as before; one that dies during a deaf spell
// within timeout + one tick after the spell ends (each late tick ends one).
// Thread-safe; heard_since_ms() is lock-free (the heartbeat path reads it).
#ifndef CKPT_COORDINATOR_HEARING_H_
#define CKPT_COORDINATOR_HEARING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::coordinator {

class Hearing {
 public:
  // now_ms: the coordinator's clock (its heartbeat times are on it).
  explicit Hearing(std::function<int64_t()> now_ms);

  // The coordinator could not hear until now: every window restarts now.
  void RestartWindows(std::string_view why);
  // No node's window started before this (INT64_MIN: never deaf).
  int64_t heard_since_ms() const {
    return heard_since_ms_.load(std::memory_order_acquire);
  }
  // The failure detector woke `late_ms` after it was due (a real clock, not
  // the coordinator's: a test may move that one). Later than `limit_ms`:
  // the process could not run, so it could not hear; returns true then.
  bool NoteWake(int64_t late_ms, int64_t limit_ms);
  // A heartbeat admission refused (its node was still heard).
  void NoteShed() { shed_.fetch_add(1, std::memory_order_relaxed); }

  struct Stats {
    uint64_t deaf_spells = 0;  // RestartWindows calls
    uint64_t late_wakes = 0;   // of which, the detector woke late
    uint64_t shed_heartbeats = 0;
    std::string last_why;
  };
  Stats stats() const;

 private:
  const std::function<int64_t()> now_ms_;
  std::atomic<int64_t> heard_since_ms_{INT64_MIN};
  std::atomic<uint64_t> shed_{0};
  mutable absl::Mutex mu_;
  uint64_t deaf_spells_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t late_wakes_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_why_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_HEARING_H_
