// Coordinator: the pairwise network check (net_check.h plans the pairs and
// the figures; this feeds it the nodes' heartbeats and puts a finished
// round into their health reports).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/replica_placement.h"

namespace ckpt::coordinator {

void Coordinator::NetCheckLocked(Batch* batch, const v1::HeartbeatRequest& req,
                                 v1::HeartbeatResponse* resp) {
  const int64_t now = options_.now_ms();
  std::map<std::string, NetEndpoint> probing;
  for (const auto& [id, n] : nodes_)
    if (n.rec.health() == v1::ALIVE && n.rec.net_probe_port() != 0 &&
        !n.rec.address().empty())
      probing[id] = {HostOf(n.rec.address()), n.rec.net_probe_port()};
  net_check_.SetNodes(probing, now);
  bool finished = false;
  for (const v1::NetProbeResult& r : req.net_results())
    finished |= net_check_.Record(req.node_id(), r, now);
  finished |= net_check_.ExpireLate(now);
  for (v1::NetProbeOrder& o : net_check_.OrdersFor(req.node_id(), now))
    *resp->add_net_probes() = std::move(o);
  if (!finished) return;
  for (const auto& [id, f] : net_check_.figures()) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.rec.health() != v1::ALIVE) continue;
    v1::NodeHealthReport* report = it->second.rec.mutable_health_report();
    auto checks = report->mutable_checks();
    checks->erase(std::remove_if(checks->begin(), checks->end(),
                                 [](const v1::HealthCheck& c) {
                                   return c.name() == "network";
                                 }),
                  checks->end());
    v1::HealthCheck* c = report->add_checks();
    c->set_name("network");
    c->set_unit("MB/s");
    c->set_figure(f.mb_per_s);
    c->set_passed(f.mb_per_s > 0);
    // The errors, if any, bounded as a report's reason is.
    c->set_reason(f.errors.substr(0, 512));
  }
  JudgeHealthLocked(batch);
}

}  // namespace ckpt::coordinator
