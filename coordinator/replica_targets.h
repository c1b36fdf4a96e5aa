// ReplicaTargets: the replica target each node is told in its heartbeats
// (the placement of replica_placement.h, kept until the membership
// changes) and the refusals that move a target (replica_refusals.h). The
// caller says when the placement is stale (a node joined, died, was
// cordoned, started or stopped hosting ranks or fetching) and hands the
// candidates when it must be computed again. Soft state, not thread-safe:
// the Coordinator keeps it under its state mutex.
#ifndef CKPT_COORDINATOR_REPLICA_TARGETS_H_
#define CKPT_COORDINATOR_REPLICA_TARGETS_H_

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

  void MarkStale() { stale_ = true; }
  // Source -> holder; computed again from `candidates` only when stale.
  const std::map<std::string, std::string>& Current(
      Candidates candidates, const ReplicaRefusals::EpochOf& epoch_of);
  // `holder` refused `source`'s copies for want of room. Only a refusal of
  // the target `source` has now counts (a retried heartbeat may carry one
  // of an earlier target); true when it moves the placement (stale now).
  bool Refused(const std::string& source, const std::string& holder,
               Candidates candidates, const ReplicaRefusals::EpochOf& epoch_of);

 private:
  std::map<std::string, std::string> targets_;
  bool stale_ = true;
  ReplicaRefusals refusals_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REPLICA_TARGETS_H_
