// Coordinator: cordoning. A cordoned node is kept out of
// placement and its ranks move to a spare as a dead node's do; an operator
// cordons and uncordons (ckptctl), and the coordinator cordons a node on
// its own after repeated incidents there (cordon_policy.h: hangs, crashes,
// a suspect node's restores) or, with
// --evict-stragglers, a straggler's node — but only when a spare can take
// its ranks. The mark is in the node's durable record.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/coordinator.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

v1::Event CordonEvent(v1::EventKind kind, const std::string& job,
                      const std::string& node, const std::string& detail,
                      const std::string& reason, const std::string& by) {
  v1::Event e;
  e.set_kind(kind);
  e.set_job(job);
  e.set_node_id(node);
  e.set_detail(detail);
  e.mutable_cordon()->set_reason(reason);
  e.mutable_cordon()->set_by(by);
  return e;
}

}  // namespace

NodeState* Coordinator::SpareForLocked(size_t ranks) {
  for (auto& [id, n] : nodes_)
    if (n.rec.spare() && Placeable(n.rec) &&
        n.rec.capacity() >= HostedRanksLocked(id) + ranks &&
        !StaleSpareLocked(n))
      return &n;
  return nullptr;
}

void Coordinator::CordonLocked(Batch* batch, NodeState& node,
                               const std::string& reason,
                               const std::string& by) {
  const std::string id = node.rec.node_id();
  node.rec.set_cordoned(true);
  replica_targets_.MarkStale();
  node.rec.set_cordon_reason(reason);
  node.incidents.Clear();
  batch->PutNode(node.rec);
  const uint32_t hosted = HostedRanksLocked(id);
  LogLocked(batch, CordonEvent(v1::CORDONED, "", id,
                               absl::StrCat("node ", id, " cordoned (", by,
                                            "): ", reason, "; ", hosted,
                                            " hosted ranks move to a spare"),
                               reason, by));
  for (auto& [name, job] : jobs_)
    if (job.ranks_by_node.count(id))
      MakePlanLocked(batch, job, absl::StrCat("node ", id, " cordoned"));
}

bool Coordinator::EvictLocked(Batch* batch, const std::string& node_id,
                              const std::string& job, const std::string& reason,
                              const std::string& by) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || it->second.rec.cordoned()) return false;
  const uint32_t hosted = HostedRanksLocked(node_id);
  if (!SpareForLocked(hosted)) {
    // The job keeps running where it is: a cordon now would leave its
    // ranks without a host until someone adds a node.
    LogLocked(
        batch,
        CordonEvent(v1::EVICTION_SKIPPED, job, node_id,
                    absl::StrCat("node ", node_id, " not replaced (", reason,
                                 "): no healthy spare has room ", "for its ",
                                 hosted, " ranks", UnhealthySparesLocked()),
                    reason, by));
    return false;
  }
  CordonLocked(batch, it->second, reason, by);
  return true;
}

bool Coordinator::ChargeIncidentLocked(Batch* batch, const std::string& node_id,
                                       const std::string& job,
                                       uint64_t generation,
                                       const std::string& what,
                                       IncidentKind kind) {
  const CordonPolicy& p = options_.cordon;
  auto it = nodes_.find(node_id);
  if (p.after <= 0 || it == nodes_.end() || it->second.rec.cordoned())
    return false;
  IncidentLog& log = it->second.incidents;
  const int n = log.Add(p, options_.now_ms(), job, generation, kind);
  if (!IncidentLog::Due(p, n)) return false;
  // "2 hangs or trainer crashes", "1 suspect restore", or both joined.
  std::string counted;
  if (int f = log.Count(IncidentKind::kFailure); f > 0)
    counted = absl::StrCat(f, " hangs or trainer crashes");
  if (int r = log.Count(IncidentKind::kSuspectRestore); r > 0)
    absl::StrAppend(&counted, counted.empty() ? "" : " and ", r,
                    r == 1 ? " suspect restore" : " suspect restores");
  return EvictLocked(
      batch, node_id, job,
      absl::StrFormat("%s within %g s (--cordon-after %d); the last: %s",
                      counted, p.window_s, p.after, what),
      "incidents");
}

absl::StatusOr<v1::CordonResponse> Coordinator::Cordon(
    const v1::CordonRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(
      ValidatePrintable(req.reason(), "reason", kMaxCordonReasonBytes));
  Txn txn(this);
  auto it = nodes_.find(req.node_id());
  if (it == nodes_.end())
    return txn.Commit(absl::NotFoundError(
        absl::StrCat("node_id: \"", req.node_id(), "\" is not registered")));
  v1::CordonResponse resp;
  resp.set_changed(!it->second.rec.cordoned());
  if (resp.changed())
    CordonLocked(txn.batch(), it->second, req.reason(), "operator");
  resp.set_reason(it->second.rec.cordon_reason());
  return txn.Commit(resp);
}

absl::StatusOr<v1::UncordonResponse> Coordinator::Uncordon(
    const v1::UncordonRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  Txn txn(this);
  Batch& batch = *txn.batch();
  auto it = nodes_.find(req.node_id());
  if (it == nodes_.end())
    return txn.Commit(absl::NotFoundError(
        absl::StrCat("node_id: \"", req.node_id(), "\" is not registered")));
  NodeState& node = it->second;
  v1::UncordonResponse resp;
  resp.set_changed(node.rec.cordoned());
  if (resp.changed()) {
    const std::string was = node.rec.cordon_reason();
    node.rec.set_cordoned(false);
    replica_targets_.MarkStale();
    node.rec.clear_cordon_reason();
    node.incidents.Clear();
    // Its ranks went to a spare: it takes the spare's place.
    if (HostedRanksLocked(req.node_id()) == 0) node.rec.set_spare(true);
    batch.PutNode(node.rec);
    LogLocked(&batch,
              CordonEvent(v1::UNCORDONED, "", req.node_id(),
                          absl::StrCat(
                              "node ", req.node_id(), " uncordoned (was: ", was,
                              ")", node.rec.spare() ? "; a spare again" : ""),
                          was, "operator"));
    // A plan waiting for a host may have one now.
    for (auto& [name, job] : jobs_)
      if (job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE &&
          Placeable(node.rec))
        MakePlanLocked(&batch, job,
                       absl::StrCat("node ", req.node_id(), " uncordoned"));
  }
  resp.set_spare(node.rec.spare());
  return txn.Commit(resp);
}

}  // namespace ckpt::coordinator
