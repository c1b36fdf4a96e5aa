#include "coordinator/metrics.h"

#include <prometheus/gauge.h>

#include <chrono>
#include <set>

namespace ckpt::coordinator {
namespace {

using prometheus::Histogram;
using prometheus::Labels;

// Seconds: a commit waits for the slowest rank's persist; a recovery for a
// prefetch from storage and every trainer's restart.
const Histogram::BucketBoundaries kCommitBuckets = {
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
const Histogram::BucketBoundaries kRecoveryBuckets = {
    0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600};
// Steps whose commit is awaited; a job that never commits must not grow it.
constexpr size_t kMaxPendingSteps = 4096;

double Seconds(int64_t from_ms, int64_t to_ms) {
  return to_ms > from_ms ? static_cast<double>(to_ms - from_ms) / 1000.0 : 0.0;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics()
    : commit_seconds_(
          prometheus::BuildHistogram()
              .Name("ckpt_coordinator_commit_seconds")
              .Help(
                  "First shard report of a step to its global commit (manifest "
                  "written, last good step moved)")
              .Register(*registry_)),
      steps_committed_(prometheus::BuildCounter()
                           .Name("ckpt_coordinator_steps_committed_total")
                           .Help("Steps whose global manifest was written")
                           .Register(*registry_)),
      failures_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_failures_detected_total")
              .Help(
                  "Failures detected, by reason (node_dead: heartbeat timeout; "
                  "trainer_exit: a trainer exited with an error)")
              .Register(*registry_)),
      peer_probes_(prometheus::BuildCounter()
                       .Name("ckpt_coordinator_peer_probes_total")
                       .Help("Nodes probed because a trainer's exit said its "
                             "peers there were lost, by outcome (answered: "
                             "alive, it keeps its ranks; dead: no answer "
                             "within --peer-probe-timeout-ms)")
                       .Register(*registry_)),
      plans_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_plans_total")
              .Help("Recovery plans made (including ones waiting for a node)")
              .Register(*registry_)),
      recovery_seconds_(
          prometheus::BuildHistogram()
              .Name("ckpt_coordinator_recovery_seconds")
              .Help("First recovery plan of a failure to every order of the "
                    "job's plan acknowledged")
              .Register(*registry_)),
      steps_trimmed_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_soft_steps_trimmed_total")
              .Help(
                  "Uncommitted steps whose per-rank records were dropped: a "
                  "job "
                  "kept more steps newer than its last good one than the bound")
              .Register(*registry_)),
      fallbacks_(prometheus::BuildCounter()
                     .Name("ckpt_coordinator_restore_fallbacks_total")
                     .Help("Restores that fell back because a copy of a shard "
                           "failed verification, "
                           "by job and failed copy (memory, file, object)")
                     .Register(*registry_)),
      unconfirmed_claims_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_unconfirmed_bad_copy_claims_total")
              .Help("Copies a restore claimed bad that the node's own check "
                    "found good and kept, by node: a node that keeps "
                    "reporting them has faulty memory or a faulty device")
              .Register(*registry_)),
      restore_sources_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_restore_sources_total")
              .Help("Ranks a recovery plan fetched onto a new host, by job "
                    "and source (replica, own slot, storage)")
              .Register(*registry_)),
      stragglers_(prometheus::BuildGauge()
                      .Name("ckpt_coordinator_straggler")
                      .Help("1 while a rank is a straggler: its compute (or "
                            "step) time above --straggler-factor x the "
                            "job's median for --straggler-windows windows")
                      .Register(*registry_)),
      relay_batches_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_relay_batches_total")
              .Help("RelayBatch calls from relays, by outcome (applied; "
                    "shed: admission full; refused: the whole batch, not "
                    "leader, not a relay identity or a bad field)")
              .Register(*registry_)),
      relayed_items_(
          prometheus::BuildCounter()
              .Name("ckpt_coordinator_relayed_items_total")
              .Help("Node calls carried by relays' batches, by kind "
                    "(heartbeat, report) and outcome (applied, shed)")
              .Register(*registry_)),
      direct_calls_(prometheus::BuildCounter()
                        .Name("ckpt_coordinator_direct_calls_total")
                        .Help("Node calls made directly, not through a "
                              "relay, by kind (heartbeat, report)")
                        .Register(*registry_)),
      direct_heartbeats_(&direct_calls_.Add({{"kind", "heartbeat"}})),
      direct_reports_(&direct_calls_.Add({{"kind", "report"}})) {
  commit_seconds_.Add({}, kCommitBuckets);
  steps_committed_.Add({});
  steps_trimmed_.Add({});
  for (auto reason : {metric::kNodeDead, metric::kTrainerExit,
                      metric::kPlanUnacknowledged, metric::kHang})
    failures_.Add({{"reason", std::string(reason)}});
  plans_.Add({});
  for (const char* outcome : {"answered", "dead"})
    peer_probes_.Add({{"outcome", outcome}});
  recovery_seconds_.Add({}, kRecoveryBuckets);
  for (const char* outcome : {"applied", "shed", "refused"})
    relay_batches_.Add({{"outcome", outcome}});
  for (const char* kind : {"heartbeat", "report"})
    for (const char* outcome : {"applied", "shed"})
      relayed_items_.Add({{"kind", kind}, {"outcome", outcome}});
}

void CoordinatorMetrics::DirectCall(DirectKind kind) {
  (kind == DirectKind::kHeartbeat ? direct_heartbeats_ : direct_reports_)
      ->Increment();
}

void CoordinatorMetrics::RelayBatch(std::string_view outcome, int heartbeats,
                                    int reports) {
  const std::string out(outcome);
  relay_batches_.Add({{"outcome", out}}).Increment();
  if (out == "refused") return;
  if (heartbeats > 0)
    relayed_items_.Add({{"kind", "heartbeat"}, {"outcome", out}})
        .Increment(heartbeats);
  if (reports > 0)
    relayed_items_.Add({{"kind", "report"}, {"outcome", out}})
        .Increment(reports);
}

void CoordinatorMetrics::StepReported(const std::string& job, uint64_t step,
                                      int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_report_ms_.size() >= kMaxPendingSteps)
    first_report_ms_.erase(first_report_ms_.begin());
  first_report_ms_.emplace(std::make_pair(job, step), now_ms);
}

void CoordinatorMetrics::StepCommitted(const std::string& job, uint64_t step,
                                       bool last_good, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  steps_committed_.Add({}).Increment();
  auto it = first_report_ms_.find({job, step});
  if (it != first_report_ms_.end()) {
    commit_seconds_.Add({}, kCommitBuckets)
        .Observe(Seconds(it->second, now_ms));
    // Steps at or below a committed one are never committed later.
    auto first = first_report_ms_.lower_bound({job, 0});
    first_report_ms_.erase(first, std::next(it));
  }
  if (last_good)
    last_good_unix_s_[job] =
        std::chrono::duration<double>(
            std::chrono::system_clock::now().time_since_epoch())
            .count();
}

void CoordinatorMetrics::StepsTrimmed(uint64_t steps) {
  steps_trimmed_.Add({}).Increment(static_cast<double>(steps));
}

void CoordinatorMetrics::RestoreFellBack(const std::string& job,
                                         const std::string& copy) {
  fallbacks_.Add({{"ckpt_job", job}, {"copy", copy}}).Increment();
}

void CoordinatorMetrics::BadCopyClaimUnconfirmed(const std::string& node) {
  unconfirmed_claims_.Add({{"node", node}}).Increment();
}

void CoordinatorMetrics::RestoreSourced(const std::string& job,
                                        const std::string& copy) {
  restore_sources_.Add({{"ckpt_job", job}, {"copy", copy}}).Increment();
}

void CoordinatorMetrics::SetStraggler(const std::string& job,
                                      const std::string& node, uint32_t rank,
                                      bool straggler) {
  stragglers_
      .Add({{"ckpt_job", job}, {"node", node}, {"rank", std::to_string(rank)}})
      .Set(straggler ? 1 : 0);
}

void CoordinatorMetrics::PeerProbed(bool answered) {
  peer_probes_.Add({{"outcome", answered ? "answered" : "dead"}}).Increment();
}

void CoordinatorMetrics::FailureDetected(std::string_view reason) {
  failures_.Add({{"reason", std::string(reason)}}).Increment();
}

void CoordinatorMetrics::PlanMade(const std::string& job, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.Add({}).Increment();
  recovery_start_ms_.emplace(
      job, now_ms);  // a later plan of the same recovery keeps the start
}

void CoordinatorMetrics::PlanAcknowledged(const std::string& job,
                                          int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = recovery_start_ms_.find(job);
  if (it == recovery_start_ms_.end()) return;
  recovery_seconds_.Add({}, kRecoveryBuckets)
      .Observe(Seconds(it->second, now_ms));
  recovery_start_ms_.erase(it);
}

void CoordinatorMetrics::SetClusterSource(
    std::function<v1::GetClusterResponse()> source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

std::vector<prometheus::MetricFamily> CoordinatorMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out = registry_->Collect();
  v1::GetClusterResponse cluster;
  {
    std::lock_guard<std::mutex> lock(source_mu_);
    if (!source_) return out;
    cluster = source_();
  }
  // A fresh registry per scrape: a job that is gone has no series.
  prometheus::Registry gauges;
  auto& nodes = prometheus::BuildGauge()
                    .Name("ckpt_coordinator_nodes")
                    .Help(
                        "Registered nodes by state (alive, dead: timed out or "
                        "fenced) and role")
                    .Register(gauges);
  auto& last_good = prometheus::BuildGauge()
                        .Name("ckpt_coordinator_last_good_step")
                        .Help(
                            "The job's last good step (global manifest written "
                            "on every rank)")
                        .Register(gauges);
  auto& last_good_time =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_last_good_step_timestamp_seconds")
          .Help("Unix time at which the last good step was committed")
          .Register(gauges);
  auto& last_good_age =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_last_good_step_age_seconds")
          .Help("Seconds since the last good step was committed")
          .Register(gauges);
  auto& recovering =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_recovery_in_progress")
          .Help("1 while the job has a plan not yet acknowledged")
          .Register(gauges);
  auto& held = prometheus::BuildGauge()
                   .Name("ckpt_coordinator_job_held")
                   .Help(
                       "1 while the job is held: its plans since the last "
                       "commit all failed (ckptctl resume)")
                   .Register(gauges);
  auto& lost = prometheus::BuildGauge()
                   .Name("ckpt_coordinator_lost_ranks")
                   .Help("Ranks of the job waiting for a node to host them")
                   .Register(gauges);
  auto& healthy =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_node_healthy")
          .Help("1 if the node's health check passed (it may take ranks)")
          .Register(gauges);
  for (const auto& n : cluster.nodes())
    if (n.health() == v1::ALIVE)
      healthy.Add({{"node", n.node_id()}}).Set(n.unhealthy() ? 0 : 1);
  auto& cordoned =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_node_cordoned")
          .Help("1 if the node is cordoned (kept out of placement)")
          .Register(gauges);
  for (const auto& n : cluster.nodes())
    cordoned.Add({{"node", n.node_id()}}).Set(n.cordoned() ? 1 : 0);
  std::map<std::pair<std::string, std::string>, double> by_state;
  for (const char* state : {"alive", "dead"})
    for (const char* role : {"worker", "spare"}) by_state[{state, role}] = 0;
  for (const auto& n : cluster.nodes())
    by_state[{n.health() == v1::ALIVE ? "alive" : "dead",
              n.spare() ? "spare" : "worker"}] += 1;
  for (const auto& [key, count] : by_state)
    nodes.Add({{"state", key.first}, {"role", key.second}}).Set(count);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  std::set<std::string> jobs;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& j : cluster.jobs()) {
    const Labels l{{"ckpt_job", j.job()}};
    jobs.insert(j.job());
    recovering.Add(l).Set(j.plan_state() == v1::PLAN_WAITING_FOR_NODE ||
                                  j.plan_state() == v1::PLAN_ORDERED
                              ? 1
                              : 0);
    held.Add(l).Set(j.plan_state() == v1::PLAN_HELD ? 1 : 0);
    lost.Add(l).Set(j.lost_ranks_size());
    if (!j.has_last_good()) continue;
    last_good.Add(l).Set(static_cast<double>(j.last_good_step()));
    auto t = last_good_unix_s_.find(j.job());
    if (t == last_good_unix_s_.end()) continue;
    last_good_time.Add(l).Set(t->second);
    last_good_age.Add(l).Set(now > t->second ? now - t->second : 0);
  }
  auto& replicated =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_replicated_ranks")
          .Help("Ranks of the job with a verified replica on a live holder")
          .Register(gauges);
  auto& memory_step =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_memory_restorable_step")
          .Help(
              "Newest step every rank of the job restores from memory "
              "(its host, or a live peer's replica)")
          .Register(gauges);
  auto& replicated_step =
      prometheus::BuildGauge()
          .Name("ckpt_coordinator_replicated_step")
          .Help(
              "Newest step every rank of the job has a verified replica of on "
              "a live holder (what any one node's loss restores at worst)")
          .Register(gauges);
  for (const auto& m : cluster.memory()) {
    const Labels l{{"ckpt_job", m.job()}};
    replicated.Add(l).Set(m.replicated_ranks());
    if (m.has_replicated_step())
      replicated_step.Add(l).Set(static_cast<double>(m.replicated_step()));
    if (m.has_memory_step())
      memory_step.Add(l).Set(static_cast<double>(m.memory_step()));
  }
  for (auto& f : gauges.Collect()) out.push_back(std::move(f));
  return out;
}

}  // namespace ckpt::coordinator
