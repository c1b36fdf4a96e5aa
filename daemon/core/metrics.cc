#include "daemon/core/metrics.h"

#include <chrono>

namespace ckpt::daemon {
namespace {

using prometheus::Histogram;
using prometheus::Labels;

// Seconds. A save's stall is milliseconds to seconds; a persist of a large
// shard can take minutes; a restore from memory is sub-millisecond.
const Histogram::BucketBoundaries kSaveBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
const Histogram::BucketBoundaries kPersistBuckets = {
    0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
const Histogram::BucketBoundaries kRestoreBuckets = {
    0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300};

Labels L(std::string_view name, std::string_view value) {
  return Labels{{std::string(name), std::string(value)}};
}

template <typename T>
void RemoveSeries(prometheus::Family<T>& family, const Labels& labels) {
  if (family.Has(labels)) family.Remove(&family.Add(labels));
}
void RemoveSeries(prometheus::Family<Histogram>& family, const Labels& labels,
                  const Histogram::BucketBoundaries& buckets) {
  if (family.Has(labels)) family.Remove(&family.Add(labels, buckets));
}

}  // namespace

DaemonMetrics::DaemonMetrics()
    : save_stall_(prometheus::BuildHistogram()
                      .Name("ckptd_save_stall_seconds")
                      .Help("Daemon-side stall of a save: BeginSave's arrival "
                            "to CommitSave "
                            "accepted (slot wait + the client's copy + commit)")
                      .Register(*registry_)),
      save_slot_wait_(
          prometheus::BuildHistogram()
              .Name("ckptd_save_slot_wait_seconds")
              .Help("Time BeginSave waited for a free slot, per committed save")
              .Register(*registry_)),
      save_copy_(
          prometheus::BuildHistogram()
              .Name("ckptd_save_copy_seconds")
              .Help(
                  "Slot granted (BeginSave answered) to CommitSave's arrival: "
                  "the "
                  "client's copy and checksum of the shard into shared memory")
              .Register(*registry_)),
      saved_bytes_(prometheus::BuildCounter()
                       .Name("ckptd_saved_bytes_total")
                       .Help("Shard image bytes of committed saves")
                       .Register(*registry_)),
      persist_seconds_(
          prometheus::BuildHistogram()
              .Name("ckptd_persist_seconds")
              .Help("Duration of one successful shard write to a storage tier "
                    "(checksum verification included)")
              .Register(*registry_)),
      persisted_bytes_(
          prometheus::BuildCounter()
              .Name("ckptd_persisted_bytes_total")
              .Help("Shard bytes written durably to a storage tier")
              .Register(*registry_)),
      persisted_shards_(prometheus::BuildCounter()
                            .Name("ckptd_persisted_shards_total")
                            .Help("Shards written durably to a storage tier")
                            .Register(*registry_)),
      failures_(prometheus::BuildCounter()
                    .Name("ckptd_failures_total")
                    .Help("Failed operations, by kind")
                    .Register(*registry_)),
      retries_(prometheus::BuildCounter()
                   .Name("ckptd_retries_total")
                   .Help("Operations re-queued after a failure, by kind")
                   .Register(*registry_)),
      rollbacks_(prometheus::BuildCounter()
                     .Name("ckptd_rollbacks_total")
                     .Help("Saves that dropped newer steps of their rank (a "
                           "restore of an older step, or an explicit rewind)")
                     .Register(*registry_)
                     .Add({})),
      restore_seconds_(prometheus::BuildHistogram()
                           .Name("ckptd_restore_seconds")
                           .Help("OpenRestore's arrival to its answer (for "
                                 "disk: the load into "
                                 "a slot), by source")
                           .Register(*registry_)),
      restores_(prometheus::BuildCounter()
                    .Name("ckptd_restores_total")
                    .Help("Restores answered, by source")
                    .Register(*registry_)),
      restored_bytes_(
          prometheus::BuildCounter()
              .Name("ckptd_restored_bytes_total")
              .Help("Shard image bytes of answered restores, by source")
              .Register(*registry_)),
      last_durable_step_(
          prometheus::BuildGauge()
              .Name("ckptd_last_durable_step")
              .Help("Newest step whose node manifest this ckptd wrote")
              .Register(*registry_)),
      last_durable_time_(
          prometheus::BuildGauge()
              .Name("ckptd_last_durable_step_timestamp_seconds")
              .Help("Unix time at which ckptd_last_durable_step became durable")
              .Register(*registry_)),
      heartbeats_(prometheus::BuildCounter()
                      .Name("ckptd_coordinator_heartbeats_total")
                      .Help("Heartbeats the coordinator answered, by path "
                            "(relay: through --coordinator-relay; direct)")
                      .Register(*registry_)),
      heartbeats_relayed_(heartbeats_.Add(L("via", "relay"))),
      heartbeats_direct_(heartbeats_.Add(L("via", "direct"))),
      relay_fallbacks_(
          prometheus::BuildCounter()
              .Name("ckptd_relay_fallbacks_total")
              .Help("Heartbeat and report calls the relay could not carry, "
                    "sent to the coordinator directly")
              .Register(*registry_)
              .Add({})) {
  prometheus::BuildGauge()
      .Name("ckptd_build_info")
      .Help("Always 1; the version label says which ckptd runs")
      .Register(*registry_)
      .Add(L("version", CKPTD_VERSION))
      .Set(1);
  // Series that exist from the start, so that rate() and increase() see
  // their first increment and dashboards show zero rather than nothing.
  for (auto kind :
       {metric::kPersistWrite, metric::kPersistChecksum,
        metric::kPersistAbandoned, metric::kManifestWrite, metric::kRestoreLoad,
        metric::kRestoreChecksum, metric::kRestoreClaimUnconfirmed})
    failures_.Add(L("kind", kind));
  for (auto kind : {metric::kRetryPersist, metric::kRetryManifest})
    retries_.Add(L("kind", kind));
  persist_seconds_.Add(L("tier", metric::kTierLocal), kPersistBuckets);
  persisted_bytes_.Add(L("tier", metric::kTierLocal));
  persisted_shards_.Add(L("tier", metric::kTierLocal));
  for (auto source : {metric::kSourceMemory, metric::kSourceDisk}) {
    restore_seconds_.Add(L("source", source), kRestoreBuckets);
    restores_.Add(L("source", source));
    restored_bytes_.Add(L("source", source));
  }
}

void DaemonMetrics::SaveCommitted(const std::string& job, double slot_wait_s,
                                  double stall_s, double copy_s,
                                  uint64_t bytes) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  auto it = save_series_.find(job);
  if (it == save_series_.end()) {
    const Labels l = L("ckpt_job", job);
    it = save_series_
             .emplace(job, SaveSeries{&save_stall_.Add(l, kSaveBuckets),
                                      &save_slot_wait_.Add(l, kSaveBuckets),
                                      &save_copy_.Add(l, kSaveBuckets),
                                      &saved_bytes_.Add(l)})
             .first;
  }
  it->second.stall->Observe(stall_s);
  it->second.slot_wait->Observe(slot_wait_s);
  it->second.copy->Observe(copy_s);
  it->second.bytes->Increment(static_cast<double>(bytes));
}

void DaemonMetrics::Persisted(std::string_view tier, double seconds,
                              uint64_t bytes) {
  const Labels l = L("tier", tier);
  persist_seconds_.Add(l, kPersistBuckets).Observe(seconds);
  persisted_bytes_.Add(l).Increment(static_cast<double>(bytes));
  persisted_shards_.Add(l).Increment();
}

void DaemonMetrics::Failure(std::string_view kind) {
  failures_.Add(L("kind", kind)).Increment();
}

void DaemonMetrics::Rollback() { rollbacks_.Increment(); }

void DaemonMetrics::Retry(std::string_view kind) {
  retries_.Add(L("kind", kind)).Increment();
}

void DaemonMetrics::Restored(std::string_view source, double seconds,
                             uint64_t bytes) {
  const Labels l = L("source", source);
  restore_seconds_.Add(l, kRestoreBuckets).Observe(seconds);
  restores_.Add(l).Increment();
  restored_bytes_.Add(l).Increment(static_cast<double>(bytes));
}

void DaemonMetrics::StepDurable(const std::string& job, uint64_t step) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  const Labels l = L("ckpt_job", job);
  // A retried manifest of an older step may land after a newer one.
  const bool known = last_durable_step_.Has(l);
  prometheus::Gauge& newest = last_durable_step_.Add(l);
  if (known && static_cast<double>(step) < newest.Value()) return;
  newest.Set(static_cast<double>(step));
  last_durable_time_.Add(l).Set(
      std::chrono::duration<double>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
}

void DaemonMetrics::ForgetJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(jobs_mu_);
  save_series_.erase(job);
  const Labels l = L("ckpt_job", job);
  RemoveSeries(save_stall_, l, kSaveBuckets);
  RemoveSeries(save_slot_wait_, l, kSaveBuckets);
  RemoveSeries(save_copy_, l, kSaveBuckets);
  RemoveSeries(saved_bytes_, l);
  RemoveSeries(last_durable_step_, l);
  RemoveSeries(last_durable_time_, l);
}

void DaemonMetrics::SetSnapshotSource(std::function<MetricsSnapshot()> source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

std::vector<prometheus::MetricFamily> DaemonMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out = registry_->Collect();
  MetricsSnapshot snap;
  {
    std::lock_guard<std::mutex> lock(source_mu_);
    if (!source_) return out;
    snap = source_();
  }
  // A fresh registry per scrape: a job or tier that is gone has no series.
  prometheus::Registry gauges;
  auto& arenas =
      prometheus::BuildGauge()
          .Name("ckptd_arenas")
          .Help("Shared-memory arenas (one per rank hosted here) of a job")
          .Register(gauges);
  auto& shm = prometheus::BuildGauge()
                  .Name("ckptd_shm_bytes")
                  .Help("Bytes of the shared-memory arenas of a job")
                  .Register(gauges);
  auto& huge = prometheus::BuildGauge()
                   .Name("ckptd_arenas_huge_pages")
                   .Help(
                       "Arenas of a job backed by 2 MiB pages (hugetlbfs); "
                       "the others have 4 KiB pages in /dev/shm")
                   .Register(gauges);
  auto& steps = prometheus::BuildGauge()
                    .Name("ckptd_persist_backlog_steps")
                    .Help("Steps with a shard not yet durable on the tier")
                    .Register(gauges);
  auto& shards =
      prometheus::BuildGauge()
          .Name("ckptd_persist_backlog_shards")
          .Help("Shards staged or being written, not yet durable on the tier")
          .Register(gauges);
  auto& bytes =
      prometheus::BuildGauge()
          .Name("ckptd_persist_backlog_bytes")
          .Help("Image bytes of the shards in ckptd_persist_backlog_shards")
          .Register(gauges);
  for (const auto& [job, g] : snap.jobs) {
    arenas.Add(L("ckpt_job", job)).Set(static_cast<double>(g.arenas));
    shm.Add(L("ckpt_job", job)).Set(static_cast<double>(g.shm_bytes));
    huge.Add(L("ckpt_job", job)).Set(static_cast<double>(g.huge_page_arenas));
  }
  for (const auto& [tier, b] : snap.backlog) {
    steps.Add(L("tier", tier)).Set(static_cast<double>(b.steps));
    shards.Add(L("tier", tier)).Set(static_cast<double>(b.shards));
    bytes.Add(L("tier", tier)).Set(static_cast<double>(b.bytes));
  }
  for (auto& f : gauges.Collect()) out.push_back(std::move(f));
  return out;
}

void DaemonMetrics::CoordinatorHeartbeat(bool relayed) {
  (relayed ? heartbeats_relayed_ : heartbeats_direct_).Increment();
}

void DaemonMetrics::RelayFallback() { relay_fallbacks_.Increment(); }

}  // namespace ckpt::daemon
