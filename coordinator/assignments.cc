#include "coordinator/assignments.h"

#include <utility>

namespace ckpt::coordinator {

void AddAssignments(const std::map<std::string, JobState>& jobs,
                    const std::string& node_id,
                    coord::v1::HeartbeatResponse* resp) {
  for (const auto& [name, job] : jobs) {
    auto hosted = job.durable_ranks_by_node.find(node_id);
    if (hosted == job.durable_ranks_by_node.end()) continue;
    const coord::v1::JobRecord& rec = job.durable_rec;
    coord::v1::Assignment a;
    *a.mutable_ranks() = {hosted->second.begin(), hosted->second.end()};
    a.set_job(name);
    a.set_world_size(rec.world_size());
    a.set_generation(rec.generation());
    a.set_has_last_good(rec.has_last_good());
    a.set_last_good_step(rec.last_good_step());
    a.set_has_restore_step(rec.has_restore_step());
    a.set_restore_step(rec.restore_step());
    *resp->add_assignments() = std::move(a);
  }
}

}  // namespace ckpt::coordinator
