// ReplicaTargets: the replica target each node is told in its heartbeats
// (the placement of replica_placement.h, kept until the membership
// changes) and the refusals that move a target (replica_refusals.h). The
// caller says when the placement is stale (a node joined, died, was
// cordoned, started or stopped hosting ranks or fetching) and hands the
// candidates when it must be computed again. Soft state, not thread-safe:
// the Coordinator keeps it under its state mutex.
#ifndef CKPT_COORDINATOR_REPLICA_TARGETS_H_
#define CKPT_COORDINATOR_REPLICA_TARGETS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "coordinator/replica_placement.h"
#include "coordinator/replica_refusals.h"

namespace ckpt::coordinator {

class ReplicaTargets {
 public:
  // The nodes the placement chooses among (their exclusions are filled
  // here, from the refusals that stand).
  using Candidates = absl::FunctionRef<std::vector<PlacementNode>()>;

  // At most kExactNodes candidates, a stale placement is computed again at
  // once. Beyond, at most every kMinAgeMs: a registration storm marks it
  // stale once per registration and every heartbeat asks for it, and
  // computing it is O(N log N), so at once would be O(N^2) for the storm.
  // A target at most kMinAgeMs old is harmless: a holder that died or
  // has no room refuses the copies, and a refusal moves it at once.
  static constexpr size_t kExactNodes = 64;
  static constexpr int64_t kMinAgeMs = 200;

  void MarkStale() { stale_ = true; }
  // Source -> holder; computed again from `candidates` only when stale
  // (and, at scale, old enough; `now_ms` is the caller's clock).
  const std::map<std::string, std::string>& Current(
      Candidates candidates, const ReplicaRefusals::EpochOf& epoch_of,
      int64_t now_ms);
  // `holder` refused `source`'s copies for want of room. Only a refusal of
  // the target `source` has now counts (a retried heartbeat may carry one
  // of an earlier target); true when it moves the placement (computed
  // again at the next Current, whatever its age).
  bool Refused(const std::string& source, const std::string& holder,
               Candidates candidates, const ReplicaRefusals::EpochOf& epoch_of,
               int64_t now_ms);

 private:
  std::map<std::string, std::string> targets_;
  bool stale_ = true;
  bool now_ = false;         // computed again at the next Current
  size_t candidates_ = 0;    // at the last computation
  int64_t computed_ms_ = 0;  // when
  ReplicaRefusals refusals_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REPLICA_TARGETS_H_
