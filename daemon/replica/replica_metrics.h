// ReplicaMetrics: the peer replicas' Prometheus series (doc/replicas.md),
// read at each scrape from the holder's store and the replicate stage's
// counters, so they never drift. Either may be null (this node holds no
// replicas, or sends none). The metrics server exists before either, so
// they are attached once made and detached before they go. Thread-safe:
// Collect holds its own mutex (which Detach waits for) and takes only the
// store's and the stage's own locks.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_METRICS_H_
#define CKPT_DAEMON_REPLICA_REPLICA_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <mutex>
#include <vector>

#include "daemon/replica/replica_store.h"
#include "daemon/replica/replicator.h"

namespace ckpt::daemon {

class ReplicaMetrics : public prometheus::Collectable {
 public:
  void Attach(const ReplicaStore* store, const Replicator* sender) {
    std::lock_guard<std::mutex> lock(mu_);
    store_ = store;
    sender_ = sender;
  }
  void Detach() { Attach(nullptr, nullptr); }
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;
  const ReplicaStore* store_ = nullptr;
  const Replicator* sender_ = nullptr;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_METRICS_H_
