// Coordinator: node health (health_state.h judges; this keeps the verdict
// in each NodeRecord and logs HEALTH_FAILED), and re-checks: on demand
// (CheckHealth) and of a spare whose report is too old to give it ranks.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/health_state.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {

void Coordinator::JudgeHealthLocked(Batch* batch, const std::string* changed) {
  if (changed != nullptr) health_medians_.Changed();
  if (changed == nullptr || health_medians_.Stale()) {
    std::vector<const v1::NodeHealthReport*> reports;
    for (const auto& [id, n] : nodes_)
      if (n.rec.health() == v1::ALIVE)
        reports.push_back(&n.rec.health_report());
    health_medians_.Take(reports);
    for (auto& [id, n] : nodes_)
      if (n.rec.health() == v1::ALIVE)
        JudgeNodeHealthLocked(batch, id, n, health_medians_.medians());
    return;
  }
  auto it = nodes_.find(*changed);
  if (it != nodes_.end() && it->second.rec.health() == v1::ALIVE)
    JudgeNodeHealthLocked(batch, it->first, it->second,
                          health_medians_.medians());
}

void Coordinator::JudgeNodeHealthLocked(
    Batch* batch, const std::string& id, NodeState& n,
    const std::map<std::string, double>& medians) {
  const HealthVerdict v =
      JudgeHealth(n.rec.health_report(), medians, options_.health_min_ratio);
  // A low figure the node measured itself is one sample, perhaps taken in
  // a burst of load: ask for another before the verdict (the node takes
  // no new ranks meanwhile), and judge the answer.
  if (!v.healthy && !n.rec.unhealthy() && !n.low_figure_answered &&
      LowOwnFigure(n.rec.health_report(), v.check)) {
    if (n.health_requested == 0) n.health_requested = NextHealthRequestLocked();
    n.low_figure_recheck = n.health_requested;
    return;
  }
  if (n.low_figure_answered || v.healthy) n.low_figure_recheck = 0;
  if (v.healthy == !n.rec.unhealthy() && v.check == n.rec.unhealthy_check() &&
      v.reason == n.rec.unhealthy_reason())
    return;  // unchanged
  n.rec.set_unhealthy(!v.healthy);
  replica_targets_.MarkStale();  // an unhealthy node holds no replicas
  n.rec.set_unhealthy_check(v.check);
  n.rec.set_unhealthy_reason(v.reason);
  batch->PutNode(n.rec);
  if (v.healthy) return;
  v1::Event e;
  e.set_node_id(id);
  e.set_kind(v1::HEALTH_FAILED);
  e.set_detail(
      absl::StrCat(v.check, ": ", v.reason, "; the node is given no ranks"));
  e.mutable_health()->set_check(v.check);
  e.mutable_health()->set_reason(v.reason);
  LogLocked(batch, std::move(e));
}

void Coordinator::NoteUnconfirmedClaimLocked(Batch* batch,
                                             const std::string& node_id,
                                             const std::string& job,
                                             const std::string& what) {
  const SuspectPolicy& p = options_.suspect;
  NodeState& node = nodes_.at(node_id);
  const int n = node.claims.Add(p, options_.now_ms());
  if (!ClaimLog::Due(p, n)) return;
  // Each restore of a suspect node that claims again counts toward its
  // cordon, once per job generation like a crash.
  auto j = jobs_.find(job);
  const bool cordoned =
      j != jobs_.end() &&
      ChargeIncidentLocked(batch, node_id, job, j->second.rec.generation(),
                           what, IncidentKind::kSuspectRestore);
  v1::NodeHealthReport* report = node.rec.mutable_health_report();
  for (const v1::HealthCheck& c : report->checks())
    if (c.name() == kSuspectCheck && !c.passed()) return;  // already suspect
  const bool was_placeable = Placeable(node.rec);
  v1::HealthCheck* slot = nullptr;
  for (v1::HealthCheck& c : *report->mutable_checks())
    if (c.name() == kSuspectCheck) slot = &c;
  *(slot ? slot : report->add_checks()) = SuspectCheck(p, n);
  batch->PutNode(node.rec);
  JudgeHealthLocked(batch, &node_id);
  // As for any node turning unhealthy: its ranks move (a cordon above
  // has planned already).
  if (cordoned || !was_placeable || Placeable(node.rec)) return;
  for (auto& [name, j] : jobs_)
    if (j.ranks_by_node.count(node_id))
      MakePlanLocked(batch, j,
                     absl::StrCat("node ", node_id, " unhealthy (",
                                  node.rec.unhealthy_check(), ")"));
}

absl::StatusOr<v1::ReportNodeCheckResponse> Coordinator::ReportNodeCheck(
    const v1::ReportNodeCheckRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateHealthCheck(req.check(), "check"));
  Txn txn(this);
  Batch& batch = *txn.batch();
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  if (!s.ok()) return txn.Commit(s);
  NodeState& node = nodes_.at(req.node_id());
  v1::NodeHealthReport* report = node.rec.mutable_health_report();
  v1::HealthCheck* slot = nullptr;
  for (v1::HealthCheck& c : *report->mutable_checks())
    if (c.name() == req.check().name()) slot = &c;
  if (!slot && report->checks_size() >= kMaxHealthChecks)
    return txn.Commit(absl::InvalidArgumentError(
        absl::StrCat("check.name: \"", req.check().name(), "\" would be check ",
                     report->checks_size() + 1, " of node ", req.node_id(),
                     ", at most ", kMaxHealthChecks)));
  if (!slot) slot = report->add_checks();
  *slot = req.check();
  batch.PutNode(node.rec);
  JudgeHealthLocked(&batch, &req.node_id());
  if (!Placeable(node.rec))
    for (auto& [name, job] : jobs_)
      if (job.ranks_by_node.count(req.node_id()))
        MakePlanLocked(&batch, job,
                       absl::StrCat("node ", req.node_id(), " unhealthy (",
                                    node.rec.unhealthy_check(), ")"));
  v1::ReportNodeCheckResponse resp;
  resp.set_unhealthy(node.rec.unhealthy());
  return txn.Commit(resp);
}

std::string Coordinator::UnhealthySparesLocked() const {
  std::string out;
  for (const auto& [id, n] : nodes_) {
    if (n.rec.health() != v1::ALIVE || !n.rec.spare()) continue;
    if (n.rec.unhealthy())
      absl::StrAppend(&out, "; spare ", id, " is unhealthy (",
                      n.rec.unhealthy_check(), ": ", n.rec.unhealthy_reason(),
                      ")");
    else if (n.low_figure_recheck != 0)
      absl::StrAppend(&out, "; spare ", id,
                      " reported a low figure: measuring it again");
    else if (n.health_requested != 0 && Placeable(n.rec))
      absl::StrAppend(&out, "; spare ", id, "'s health check is ",
                      HealthAgeLocked(n) / 1000, " s old: checking it again");
  }
  return out;
}

int64_t Coordinator::HealthAgeLocked(const NodeState& n) const {
  return std::max<int64_t>(0, options_.now_ms() - n.health_checked_ms);
}

bool Coordinator::StaleSpareLocked(NodeState& n) {
  if (n.low_figure_recheck != 0) return true;  // being measured again
  if (options_.spare_check_max_age_ms <= 0 ||
      HealthAgeLocked(n) <= options_.spare_check_max_age_ms)
    return false;
  if (n.health_requested == 0) n.health_requested = NextHealthRequestLocked();
  return true;
}

void Coordinator::HealthRecheckLocked(Batch* batch,
                                      const v1::HeartbeatRequest& req,
                                      v1::HeartbeatResponse* resp) {
  NodeState& node = nodes_.at(req.node_id());
  if (req.has_health_report()) {
    const bool was_placeable = Placeable(node.rec);
    const bool was_asked = node.health_requested != 0;
    HealthRechecks::Merge(req.health_report(),
                          node.rec.mutable_health_report());
    if (req.health_check_id() != 0)
      node.rec.set_health_check_id(req.health_check_id());
    if (req.health_check_id() == node.health_requested)
      node.health_requested = 0;
    node.health_checked_ms = options_.now_ms();
    batch->PutNode(node.rec);
    node.low_figure_answered = node.low_figure_recheck != 0 &&
                               req.health_check_id() == node.low_figure_recheck;
    JudgeHealthLocked(batch, &req.node_id());
    node.low_figure_answered = false;
    // Plans only when the verdict changed, or a spare answered the check a
    // plan waits for: a report that says what the last one said (an idle
    // node's routine re-check, `ckptctl health`) never restarts a job.
    if (Placeable(node.rec)) {
      if (node.rec.spare() && (!was_placeable || was_asked))
        for (auto& [name, job] : jobs_)
          if (job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE)
            MakePlanLocked(batch, job,
                           absl::StrCat("spare ", req.node_id(), " checked"));
    } else if (was_placeable) {
      // A spare a waiting job counted on failed: an elastic one shrinks.
      if (node.rec.spare())
        for (auto& [name, job] : jobs_)
          if (job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE &&
              job.rec.min_world_size() != 0)
            MakePlanLocked(batch, job,
                           absl::StrCat("spare ", req.node_id(), " unhealthy"));
      for (auto& [name, job] : jobs_)
        if (job.ranks_by_node.count(req.node_id()))
          MakePlanLocked(batch, job,
                         absl::StrCat("node ", req.node_id(), " unhealthy (",
                                      node.rec.unhealthy_check(), ")"));
    }
  }
  if (node.health_requested != 0)
    resp->set_run_health_check(node.health_requested);
}

absl::StatusOr<v1::CheckHealthResponse> Coordinator::CheckHealth(
    const v1::CheckHealthRequest& req) {
  if (!req.node_id().empty())
    CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  Txn txn(this);
  std::vector<NodeState*> asked;
  for (auto& [id, n] : nodes_)
    if ((req.node_id().empty() || id == req.node_id()) &&
        n.rec.health() == v1::ALIVE)
      asked.push_back(&n);
  if (!req.node_id().empty() && asked.empty()) {
    const bool known = nodes_.count(req.node_id()) != 0;
    return txn.Commit(absl::FailedPreconditionError(
        absl::StrCat("node_id: \"", req.node_id(), "\" ",
                     known ? "is dead" : "is not registered")));
  }
  v1::CheckHealthResponse resp;
  resp.set_request_id(NextHealthRequestLocked());
  for (NodeState* n : asked) {
    n->health_requested = resp.request_id();
    resp.add_node_ids(n->rec.node_id());
  }
  if (req.network()) {
    net_check_.Restart();
    ++net_nodes_version_;  // the next heartbeat gives it the nodes again
  }
  return txn.Commit(resp);
}

}  // namespace ckpt::coordinator
