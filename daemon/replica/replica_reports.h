// What a replica holder tells the coordinator about the copies it holds
// (doc/replicas.md), through its node agent's shard reports: REPLICATED
// once a copy verified and is kept, and a withdrawal (REPLICATED, failed)
// once it is dropped (replaced by a newer copy, or given up for room), so
// that no plan names a copy the holder no longer has.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_REPORTS_H_
#define CKPT_DAEMON_REPLICA_REPLICA_REPORTS_H_

#include "daemon/core/engine_options.h"
#include "daemon/replica/replica_store.h"

namespace ckpt::daemon {

// The REPLICATED report of a kept copy.
inline ShardReport ReplicatedReportOf(const HeldReplica& held) {
  ShardReport r;
  r.job = held.copy.job();
  r.step = held.copy.step();
  r.rank = held.copy.rank();
  r.replicated = true;
  r.source_node = held.copy.source_node();
  r.bytes = held.copy.image_bytes();
  r.digest = r.staged_digest = held.digest;
  r.owner_uid = held.copy.owner_uid();
  if (held.copy.generation() != 0) r.generation = held.copy.generation();
  return r;
}

// The withdrawal of a dropped copy: the coordinator no longer counts this
// node as a source of (job, step, rank).
inline ShardReport ReplicaWithdrawalOf(const replica::v1::ShardCopy& copy) {
  ShardReport r;
  r.job = copy.job();
  r.step = copy.step();
  r.rank = copy.rank();
  r.replicated = true;
  r.failed = true;
  r.source_node = copy.source_node();
  r.bytes = copy.image_bytes();
  r.owner_uid = copy.owner_uid();
  if (copy.generation() != 0) r.generation = copy.generation();
  return r;
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_REPORTS_H_
