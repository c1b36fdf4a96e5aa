// Replica placement: which node each node sends its ranks'
// replicas to. A pure function of the membership, so the same nodes always
// get the same targets (stable across heartbeats) and any change of
// membership (a node dies, joins, is cordoned, hosts ranks or stops)
// recomputes it.
//
// Rules: every source (a node hosting ranks) gets a holder other than
// itself, in another failure domain when one exists among the holders,
// else any other holder; none: no target. Among the allowed holders the
// least loaded wins (so holders are spread), then one that does not send
// its own replicas to this source (a pair that replicates to each other
// loses both copies when both die), then the nearest after the source on a
// ring of every node sorted by domain, then id. An empty domain is a
// domain of its own. A source's excluded holders are left out first (its
// other domain is one with a holder it may get). Thread-compatible (no state).
#ifndef CKPT_COORDINATOR_REPLICA_PLACEMENT_H_
#define CKPT_COORDINATOR_REPLICA_PLACEMENT_H_

#include <map>
#include <set>
#include <string>
#include <vector>

namespace ckpt::coordinator {

struct PlacementNode {
  std::string id;
  std::string domain;   // "" = a domain of its own
  bool source = false;  // hosts ranks: needs a target
  bool holder = false;  // may hold replicas (alive, listening, placeable)
  // Holders this source must not get (they refused its copies for want of
  // room: replica_refusals.h); the rules above apply to the others.
  std::set<std::string> excluded;
};

// Source id -> holder id, for every source that has a holder.
std::map<std::string, std::string> PlaceReplicas(
    std::vector<PlacementNode> nodes);

// Whether two failure domains are the same one ("" never is).
inline bool SameDomain(const std::string& a, const std::string& b) {
  return !a.empty() && a == b;
}

// The host of a node's advertised address ("host" or "host:port"; an IPv6
// address without a port is kept whole).
std::string HostOf(const std::string& address);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REPLICA_PLACEMENT_H_
