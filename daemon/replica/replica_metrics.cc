// ReplicaMetrics (replica_metrics.h).
#include "daemon/replica/replica_metrics.h"

#include <string>

namespace ckpt::daemon {

namespace {

prometheus::MetricFamily Family(const std::string& name,
                                const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  f.metric.push_back(m);
  return f;
}

}  // namespace

std::vector<prometheus::MetricFamily> ReplicaMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  std::lock_guard<std::mutex> lock(mu_);
  if (store_ != nullptr) {
    const ReplicaStats s = store_->Stats();
    out.push_back(Family("ckptd_replica_held", "Replicas this node holds",
                         MetricType::Gauge, s.held));
    out.push_back(Family("ckptd_replica_memory_bytes",
                         "Bytes replicas take here (held, arriving, read)",
                         MetricType::Gauge, static_cast<double>(s.used_bytes)));
    out.push_back(Family("ckptd_replica_memory_budget_bytes",
                         "--replica-memory-bytes", MetricType::Gauge,
                         static_cast<double>(s.budget_bytes)));
    out.push_back(Family("ckptd_replicas_verified_total",
                         "Replicas that arrived and verified",
                         MetricType::Counter, static_cast<double>(s.verified)));
    out.push_back(Family("ckptd_replicas_rejected_total",
                         "Replicas that failed verification on arrival",
                         MetricType::Counter, static_cast<double>(s.rejected)));
    out.push_back(Family("ckptd_replicas_refused_total",
                         "Replicas refused before arrival (budget, older)",
                         MetricType::Counter, static_cast<double>(s.refused)));
  }
  if (sender_ != nullptr) {
    const ReplicatorStats s = sender_->Stats();
    out.push_back(Family("ckptd_replicas_sent_total",
                         "Replicas of this node's shards a holder verified",
                         MetricType::Counter, static_cast<double>(s.sent)));
    out.push_back(Family("ckptd_replica_sent_bytes_total",
                         "Bytes of those replicas", MetricType::Counter,
                         static_cast<double>(s.sent_bytes)));
    out.push_back(Family("ckptd_replica_send_failures_total",
                         "Replica sends that failed (each retried)",
                         MetricType::Counter, static_cast<double>(s.failed)));
    // Per job: a sender slower than two saves completes no copy.
    prometheus::MetricFamily over;
    over.name = "ckptd_replica_sends_overwritten_total";
    over.help =
        "Replica sends abandoned or refused as torn: a save reused the "
        "slot while it was sent";
    over.type = MetricType::Counter;
    for (const auto& [job, n] : s.overwritten_by_job) {
      prometheus::ClientMetric m;
      m.label.push_back({"ckpt_job", job});
      m.counter.value = static_cast<double>(n);
      over.metric.push_back(std::move(m));
    }
    out.push_back(std::move(over));
    out.push_back(Family("ckptd_replica_pending_ranks",
                         "Hosted ranks whose newest shard is not replicated",
                         MetricType::Gauge, s.pending));
  }
  return out;
}

}  // namespace ckpt::daemon
