// HealthRechecks: the heartbeat's health re-check sub-protocol apart from
// the verdict (health_state.h judges): the ids of the checks nodes are
// asked to run (HeartbeatResponse.run_health_check) and a heartbeat's
// report taken into the node's. Not thread-safe: the Coordinator keeps it
// under its state mutex.
#ifndef CKPT_COORDINATOR_HEALTH_RECHECKS_H_
#define CKPT_COORDINATOR_HEALTH_RECHECKS_H_

#include <cstdint>

#include "coordinator.pb.h"

namespace ckpt::coordinator {

class HealthRechecks {
 public:
  // Ids follow `first`: the coordinator passes this process's start time
  // in microseconds, so they differ from a previous incarnation's (a node
  // runs each id once).
  explicit HealthRechecks(uint64_t first) : last_(first) {}
  uint64_t NextRequest() { return ++last_; }
  // `fresh`'s checks replace those of the same names in `report`; the
  // checks the node does not run (the network check, a launcher's) stay.
  // At most kMaxHealthChecks (health_state.h) are kept.
  static void Merge(const coord::v1::NodeHealthReport& fresh,
                    coord::v1::NodeHealthReport* report);

 private:
  uint64_t last_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_HEALTH_RECHECKS_H_
