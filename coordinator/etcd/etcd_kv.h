// EtcdKv: KvBackend (coordinator/kv_backend.h) on an etcd cluster, every key
// under one prefix. Every Write is one etcd Txn whose compare is the
// writer's leadership: the election key must still exist with the create
// revision it had when this process won the election (election.h). A
// deposed leader (its lease expired, another replica created the key anew)
// therefore cannot write, whatever its own clock says: its Txn fails, the
// Write is UNAVAILABLE "not leader: write refused ...", nothing changes, and
// `on_fenced` runs (once).
// Scans page through the range 1,000 keys at a time. A batch must fit
// etcd's --max-txn-ops and --max-request-bytes (doc/ha-etcd.md).
// Thread-safe (EtcdClient is).
#ifndef CKPT_COORDINATOR_ETCD_ETCD_KV_H_
#define CKPT_COORDINATOR_ETCD_ETCD_KV_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "coordinator/etcd/etcd_client.h"
#include "coordinator/kv_backend.h"

namespace ckpt::coordinator::etcd {

struct Fence {
  std::string election_key;  // full etcd key
  int64_t create_revision = 0;
};

std::unique_ptr<KvBackend> NewEtcdKv(
    std::shared_ptr<EtcdClient> client, std::string prefix, Fence fence,
    std::function<void(const std::string&)> on_fenced);

}  // namespace ckpt::coordinator::etcd

#endif  // CKPT_COORDINATOR_ETCD_ETCD_KV_H_
