// Coordinator: the pairwise network check (net_check.h plans the pairs and
// the figures; this feeds it the nodes' heartbeats and puts a finished
// round into their health reports).
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/replica_placement.h"

namespace ckpt::coordinator {

void Coordinator::NetCheckLocked(Batch* batch, const v1::HeartbeatRequest& req,
                                 v1::HeartbeatResponse* resp) {
  const int64_t now = options_.now_ms();
  // The probing nodes change only when a node registers or dies (or a
  // check restarts): gathered then, not on every heartbeat, which would
  // cost every heartbeat a walk of the whole cluster under the lock.
  if (net_nodes_seen_ != net_nodes_version_) {
    net_nodes_seen_ = net_nodes_version_;
    std::map<std::string, NetEndpoint> probing;
    for (const auto& [id, n] : nodes_)
      if (n.rec.health() == v1::ALIVE && n.rec.net_probe_port() != 0 &&
          !n.rec.address().empty())
        probing[id] = {HostOf(n.rec.address()), n.rec.net_probe_port()};
    net_check_.SetNodes(probing, now);
  }
  if (!net_check_.Heartbeat(req, now, resp)) return;
  for (const auto& [id, f] : net_check_.figures()) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.rec.health() != v1::ALIVE) continue;
    PutNetworkCheck(f, it->second.rec.mutable_health_report());
  }
  JudgeHealthLocked(batch);
}

}  // namespace ckpt::coordinator
