// Where a recovery plan restores one rank's shard from, best
// first: its host's memory (no fetch), the staged slot of the live node
// that saved it (its ranks moved: cordoned, unhealthy), a live holder's
// verified replica, the shared root; kNone: nowhere. Plain data.
#ifndef CKPT_COORDINATOR_RESTORE_SOURCE_H_
#define CKPT_COORDINATOR_RESTORE_SOURCE_H_

#include "coordinator.pb.h"
#include "coordinator/replica_placement.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

struct CopySource {
  enum Kind { kNone, kHostMemory, kOwnSlot, kReplica, kStorage } kind = kNone;
  const v1::NodeRecord* node = nullptr;  // kOwnSlot, kReplica: who serves it
};

// "replica", "own slot" or "storage" (RankSource.copy).
inline const char* CopyName(CopySource::Kind kind) {
  return kind == CopySource::kReplica   ? "replica"
         : kind == CopySource::kOwnSlot ? "own slot"
                                        : "storage";
}

// What a PREFETCH names for it (Order.sources): a peer's replica listener,
// or an empty host for the shared root.
inline v1::ShardSource ShardSourceOf(const CopySource& c) {
  v1::ShardSource s;
  if (c.kind != CopySource::kReplica && c.kind != CopySource::kOwnSlot)
    return s;
  s.set_node_id(c.node->node_id());
  s.set_host(HostOf(c.node->address()));
  s.set_port(c.node->replica_port());
  s.set_replica(c.kind == CopySource::kReplica);
  return s;
}

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_RESTORE_SOURCE_H_
