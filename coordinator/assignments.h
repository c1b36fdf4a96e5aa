// The heartbeat's assignments: the ranks a node hosts per job, as of the
// last durable commit (a heartbeat never waits for a disk write), with
// what the node's retention must keep (last good and restore steps). A
// pure function of the jobs; the Coordinator calls it under its state
// mutex.
#ifndef CKPT_COORDINATOR_ASSIGNMENTS_H_
#define CKPT_COORDINATOR_ASSIGNMENTS_H_

#include <map>
#include <string>

#include "coordinator.pb.h"
#include "coordinator/coordinator_records.h"

namespace ckpt::coordinator {

// Adds an Assignment to `resp` for each job with ranks on `node_id` in
// its durable record, in job-name order.
void AddAssignments(const std::map<std::string, JobState>& jobs,
                    const std::string& node_id,
                    coord::v1::HeartbeatResponse* resp);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_ASSIGNMENTS_H_
