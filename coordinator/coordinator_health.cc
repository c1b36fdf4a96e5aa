// Coordinator: node health (health_state.h judges; this keeps the verdict
// in each NodeRecord and logs HEALTH_FAILED).
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_state.h"
#include "util/status.h"
#include "util/validate.h"

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
    replica_targets_stale_ = true;  // an unhealthy node holds no replicas
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

absl::StatusOr<v1::ReportNodeCheckResponse> Coordinator::ReportNodeCheck(
    const v1::ReportNodeCheckRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.node_id(), "node_id"));
  CKPT_RETURN_IF_ERROR(ValidateHealthCheck(req.check(), "check"));
  Lock lock(mu_);
  auto owned = std::make_unique<Batch>();
  Batch& batch = *owned;
  DetectTimeoutsLocked(&batch);
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  if (!s.ok()) {
    CKPT_RETURN_IF_ERROR(Commit(lock, std::move(owned)));
    return s;
  }
  NodeState& node = nodes_.at(req.node_id());
  v1::NodeHealthReport* report = node.rec.mutable_health_report();
  v1::HealthCheck* slot = nullptr;
  for (v1::HealthCheck& c : *report->mutable_checks())
    if (c.name() == req.check().name()) slot = &c;
  if (!slot && report->checks_size() >= kMaxHealthChecks) {
    CKPT_RETURN_IF_ERROR(Commit(lock, std::move(owned)));
    return absl::InvalidArgumentError(
        absl::StrCat("check.name: \"", req.check().name(), "\" would be check ",
                     report->checks_size() + 1, " of node ", req.node_id(),
                     ", at most ", kMaxHealthChecks));
  }
  if (!slot) slot = report->add_checks();
  *slot = req.check();
  batch.PutNode(node.rec);
  JudgeHealthLocked(&batch);
  if (!Placeable(node.rec))
    for (auto& [name, job] : jobs_)
      if (job.ranks_by_node.count(req.node_id()))
        MakePlanLocked(&batch, job,
                       absl::StrCat("node ", req.node_id(), " unhealthy (",
                                    node.rec.unhealthy_check(), ")"));
  v1::ReportNodeCheckResponse resp;
  resp.set_unhealthy(node.rec.unhealthy());
  CKPT_RETURN_IF_ERROR(Commit(lock, std::move(owned)));
  return resp;
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
