// CoordinatorMetrics: the coordinator's Prometheus metrics (doc/metrics.md
// says what each measures). Counters and histograms (failures detected,
// plans made, commit latency, recovery time) are updated by a few calls
// from the state machine where it decides; gauges (nodes by state, last good
// step and its age, recoveries in progress) are read at each scrape from
// the cluster source (Coordinator::GetCluster), so they never drift and a
// job that is gone has no series.
//
// A decision is counted when it is made; if the state commit of that call
// then fails (and the state is reloaded), the count stays: such failures
// are rare and themselves fatal to the call.
//
// Times: the *_ms arguments come from the coordinator's monotonic clock
// (CoordinatorOptions::now_ms); the last-good timestamp is wall-clock time
// taken when StepCommitted is called, so it is known only for steps
// committed since this process started.
//
// The coordinator owns a shared_ptr (CoordinatorOptions::metrics); the
// program hands a weak_ptr to its MetricsServer. Thread-safety: every
// method is safe to call concurrently. Collect() calls the cluster source
// with the source mutex held; the coordinator sets the source only outside
// its own mutex (Open, destructor).
#ifndef CKPT_COORDINATOR_METRICS_H_
#define CKPT_COORDINATOR_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coordinator.pb.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

namespace metric {
inline constexpr std::string_view kNodeDead = "node_dead";
inline constexpr std::string_view kTrainerExit = "trainer_exit";
inline constexpr std::string_view kPlanUnacknowledged = "plan_unacknowledged";
inline constexpr std::string_view kHang = "hang";
}  // namespace metric

class CoordinatorMetrics : public prometheus::Collectable {
 public:
  CoordinatorMetrics();

  // A rank reported a shard of `step`; the first report starts the step's
  // commit latency.
  void StepReported(const std::string& job, uint64_t step, int64_t now_ms);
  // The step's global manifest is written and it is the job's last good
  // step (or an older one, which only ends its latency).
  void StepCommitted(const std::string& job, uint64_t step, bool last_good,
                     int64_t now_ms);
  void FailureDetected(std::string_view reason);
  // A node a trainer's exit suspected was probed: it answered (alive, it
  // keeps its ranks) or not (dead).
  void PeerProbed(bool answered);
  // A recovery plan was made for `job`; the first plan since the last
  // acknowledged one starts the recovery time.
  void PlanMade(const std::string& job, int64_t now_ms);
  // Every order of the job's plan is acknowledged: the recovery is over.
  void PlanAcknowledged(const std::string& job, int64_t now_ms);
  // Per-rank records of `steps` steps that never committed were dropped
  // (the job kept more than max_soft_steps uncommitted steps).
  void StepsTrimmed(uint64_t steps);
  // A rank of `job` restored from another copy or step: `copy` ("memory",
  // "file", "object") failed verification.
  void RestoreFellBack(const std::string& job, const std::string& copy);
  // A restore on `node` claimed a copy bad that the node's own check found
  // good (a sign of the node's memory or device, not of the copy).
  void BadCopyClaimUnconfirmed(const std::string& node);
  // A plan fetches a rank of `job` from `copy` ("replica", "own slot",
  // "storage"; RankSource.copy).
  void RestoreSourced(const std::string& job, const std::string& copy);
  // Whether rank `rank` of `job` on `node` is a straggler now.
  void SetStraggler(const std::string& job, const std::string& node,
                    uint32_t rank, bool straggler);

  // A relay's batch (RelayBatch): `outcome` "applied" (admitted, every
  // item answered), "shed" (admission full: RESOURCE_EXHAUSTED) or
  // "refused" (the whole batch: not leader, not a relay identity, a bad
  // field); its items are counted by kind when applied or shed.
  void RelayBatch(std::string_view outcome, int heartbeats, int reports);
  // A node's Heartbeat or ReportShards call came directly, not through a
  // relay (counted once its request is valid, whether admitted or shed).
  enum class DirectKind { kHeartbeat, kReport };
  void DirectCall(DirectKind kind);

  // nullptr: no gauges.
  void SetClusterSource(std::function<v1::GetClusterResponse()> source);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::shared_ptr<prometheus::Registry> registry_ =
      std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Histogram>& commit_seconds_;
  prometheus::Family<prometheus::Counter>& steps_committed_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& peer_probes_;
  prometheus::Family<prometheus::Counter>& plans_;
  prometheus::Family<prometheus::Histogram>& recovery_seconds_;
  prometheus::Family<prometheus::Counter>& steps_trimmed_;
  prometheus::Family<prometheus::Counter>& fallbacks_;
  prometheus::Family<prometheus::Counter>& unconfirmed_claims_;
  prometheus::Family<prometheus::Counter>& restore_sources_;
  prometheus::Family<prometheus::Gauge>& stragglers_;
  prometheus::Family<prometheus::Counter>& relay_batches_;
  prometheus::Family<prometheus::Counter>& relayed_items_;
  prometheus::Family<prometheus::Counter>& direct_calls_;
  prometheus::Counter* direct_heartbeats_ = nullptr;  // in direct_calls_
  prometheus::Counter* direct_reports_ = nullptr;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, uint64_t>, int64_t>
      first_report_ms_;  // bounded
  std::map<std::string, int64_t> recovery_start_ms_;
  std::map<std::string, double>
      last_good_unix_s_;  // one entry per job ever committed
  mutable std::mutex source_mu_;
  std::function<v1::GetClusterResponse()> source_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_METRICS_H_
