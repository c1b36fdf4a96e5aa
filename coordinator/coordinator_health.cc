// Coordinator: node health (health_state.h judges; this keeps the verdict
// in each NodeRecord and logs HEALTH_FAILED).
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_state.h"

namespace ckpt::coordinator {

void Coordinator::JudgeHealthLocked(Batch* batch) {
  std::vector<const v1::NodeHealthReport*> reports;
  for (const auto& [id, n] : nodes_)
    if (n.rec.health() == v1::ALIVE) reports.push_back(&n.rec.health_report());
  const std::map<std::string, double> medians = MedianFigures(reports);
  for (auto& [id, n] : nodes_) {
    if (n.rec.health() != v1::ALIVE) continue;
    const HealthVerdict v =
        JudgeHealth(n.rec.health_report(), medians, options_.health_min_ratio);
    if (v.healthy == !n.rec.unhealthy() && v.check == n.rec.unhealthy_check() &&
        v.reason == n.rec.unhealthy_reason())
      continue;  // unchanged
    n.rec.set_unhealthy(!v.healthy);
    n.rec.set_unhealthy_check(v.check);
    n.rec.set_unhealthy_reason(v.reason);
    batch->PutNode(n.rec);
    if (v.healthy) continue;
    v1::Event e;
    e.set_node_id(id);
    e.set_kind(v1::HEALTH_FAILED);
    e.set_detail(
        absl::StrCat(v.check, ": ", v.reason, "; the node is given no ranks"));
    e.mutable_health()->set_check(v.check);
    e.mutable_health()->set_reason(v.reason);
    LogLocked(batch, std::move(e));
  }
}

std::string Coordinator::UnhealthySparesLocked() const {
  std::string out;
  for (const auto& [id, n] : nodes_)
    if (n.rec.health() == v1::ALIVE && n.rec.spare() && n.rec.unhealthy())
      absl::StrAppend(&out, "; spare ", id, " is unhealthy (",
                      n.rec.unhealthy_check(), ": ", n.rec.unhealthy_reason(),
                      ")");
  return out;
}

}  // namespace ckpt::coordinator
