// NodeReplicas: this node's side of peer replicas (doc/replicas.md) as its
// node agent sees it. The agent learns from the coordinator where copies go
// and reports what the target refused; a PREFETCH reads this node's held
// copies and hands what it fetched on to the replicate stage. The daemon
// (daemon.h) implements it over its Replicator and ReplicaStore, both made
// before the agent starts, so nothing is bound late.
#ifndef CKPT_DAEMON_REPLICA_NODE_REPLICAS_H_
#define CKPT_DAEMON_REPLICA_NODE_REPLICAS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "daemon/replica/replica_store.h"
#include "daemon/replica/replicator.h"

namespace ckpt::daemon {

class NodeReplicas {
 public:
  virtual ~NodeReplicas() = default;
  // The replica target each heartbeat names; nullopt: none.
  virtual void SetTarget(std::optional<ReplicaPeer> target) = 0;
  // The target's refusal of this node's copies for want of room, sent with
  // each heartbeat while it stands (the coordinator re-places them).
  virtual std::optional<HolderRefusal> Refused() const = 0;
  // This node's held copy of (job, step, rank); null: none.
  virtual std::shared_ptr<const HeldReplica> Held(const std::string& job,
                                                  uint64_t step,
                                                  uint32_t rank) const = 0;
  // A PREFETCH put the rank's shard of `step` in memory here: its copy goes
  // to this node's replica target as a save's does.
  virtual void Prefetched(const std::string& job, uint64_t step,
                          uint32_t rank) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_NODE_REPLICAS_H_
