// DaemonMetrics: ckptd's Prometheus metrics (doc/metrics.md lists each one
// and says exactly what it measures). Counters and histograms live in a
// prometheus-cpp Registry and are updated by a few calls from the engine at
// the points where a save commits, a persist ends, a restore is answered or
// a step becomes durable. Gauges (arenas, shared memory, persist backlog) are
// not kept up to date: at each scrape Collect() asks the snapshot source
// (the engine) for them, so they can never drift and the series of a job
// that is gone disappear with it. ForgetJob() drops a removed job's
// counter and histogram series, so the `job` label stays bounded by the
// jobs this daemon holds.
//
// Label values other than `job` come from the fixed sets below (tier,
// restore source, failure and retry kinds); callers pass those constants
// only, so each label's cardinality is fixed. Other tiers and sources
// (object, peer) plug in by passing their own constant.
//
// The engine owns a shared_ptr to it; main() hands a weak_ptr to the
// MetricsServer. Thread-safety: every method is safe to call concurrently.
// Collect() calls the snapshot source with the source mutex held; the
// source may take the engine's mutex, so the engine must not call
// SetSnapshotSource with its own mutex held (it does so only in Open and in
// its destructor).
#ifndef CKPT_DAEMON_CORE_METRICS_H_
#define CKPT_DAEMON_CORE_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::daemon {

// Label values (see doc/metrics.md).
namespace metric {
inline constexpr std::string_view kTierLocal = "local";
inline constexpr std::string_view kTierObject = "object";
inline constexpr std::string_view kSourceMemory = "memory";
inline constexpr std::string_view kSourceDisk = "disk";
inline constexpr std::string_view kSourceObject = "object";
// Failure kinds.
inline constexpr std::string_view kPersistWrite = "persist_write";
inline constexpr std::string_view kPersistChecksum = "persist_checksum";
inline constexpr std::string_view kPersistAbandoned = "persist_abandoned";
inline constexpr std::string_view kManifestWrite = "manifest_write";
inline constexpr std::string_view kRestoreLoad = "restore_load";
inline constexpr std::string_view kRestoreChecksum = "restore_checksum";
// A client found a copy bad that the daemon's own check found good.
inline constexpr std::string_view kRestoreClaimUnconfirmed =
    "restore_claim_unconfirmed";
// Retry kinds.
inline constexpr std::string_view kRetryPersist = "persist";
inline constexpr std::string_view kRetryManifest = "manifest";
}  // namespace metric

// The gauges, read from the engine at scrape time.
struct MetricsSnapshot {
  struct Job {
    uint64_t arenas = 0;
    uint64_t shm_bytes = 0;
    uint64_t huge_page_arenas = 0;  // of `arenas`, those in 2 MiB pages
  };
  struct Backlog {
    uint64_t steps = 0;   // steps with at least one shard not yet durable
    uint64_t shards = 0;  // shards staged or being persisted
    uint64_t bytes = 0;   // their image bytes
  };
  std::map<std::string, Job> jobs;
  std::map<std::string, Backlog> backlog;  // by tier
};

class DaemonMetrics : public prometheus::Collectable {
 public:
  DaemonMetrics();

  // A CommitSave was accepted: slot_wait_s is BeginSave's wait for a free
  // slot, stall_s BeginSave's arrival to the commit accepted, copy_s the
  // slot's grant to CommitSave's arrival.
  void SaveCommitted(const std::string& job, double slot_wait_s, double stall_s,
                     double copy_s, uint64_t bytes);
  // A shard write to `tier` succeeded after `seconds` (one attempt).
  void Persisted(std::string_view tier, double seconds, uint64_t bytes);
  void Failure(std::string_view kind);
  // A save dropped newer steps of its rank (a rollback it was allowed).
  void Rollback();
  void Retry(std::string_view kind);
  // OpenRestore answered from `source` after `seconds`.
  void Restored(std::string_view source, double seconds, uint64_t bytes);
  // This node's manifest of `step` is written (the step is durable here).
  void StepDurable(const std::string& job, uint64_t step);
  // The job is gone: its series go too.
  void ForgetJob(const std::string& job);
  // The node agent: a heartbeat the coordinator answered (`relayed`:
  // through --coordinator-relay); a call the relay could not carry, sent
  // directly.
  void CoordinatorHeartbeat(bool relayed);
  void RelayFallback();

  // nullptr: no gauges (the engine is gone).
  void SetSnapshotSource(std::function<MetricsSnapshot()> source);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  // One job's save series, looked up once (a label hash and the family's
  // lock per series) rather than on every CommitSave.
  struct SaveSeries {
    prometheus::Histogram* stall;
    prometheus::Histogram* slot_wait;
    prometheus::Histogram* copy;
    prometheus::Counter* bytes;
  };

  std::shared_ptr<prometheus::Registry> registry_ =
      std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Histogram>& save_stall_;
  prometheus::Family<prometheus::Histogram>& save_slot_wait_;
  prometheus::Family<prometheus::Histogram>& save_copy_;
  prometheus::Family<prometheus::Counter>& saved_bytes_;
  prometheus::Family<prometheus::Histogram>& persist_seconds_;
  prometheus::Family<prometheus::Counter>& persisted_bytes_;
  prometheus::Family<prometheus::Counter>& persisted_shards_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Counter& rollbacks_;
  prometheus::Family<prometheus::Histogram>& restore_seconds_;
  prometheus::Family<prometheus::Counter>& restores_;
  prometheus::Family<prometheus::Counter>& restored_bytes_;
  prometheus::Family<prometheus::Gauge>& last_durable_step_;
  prometheus::Family<prometheus::Gauge>& last_durable_time_;
  prometheus::Family<prometheus::Counter>& heartbeats_;
  prometheus::Counter& heartbeats_relayed_;
  prometheus::Counter& heartbeats_direct_;
  prometheus::Counter& relay_fallbacks_;

  // Guards the job-labelled series and save_series_: Add and Remove of one
  // job's series must not interleave.
  std::mutex jobs_mu_;
  std::map<std::string, SaveSeries, std::less<>> save_series_;
  mutable std::mutex source_mu_;
  std::function<MetricsSnapshot()> source_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_METRICS_H_
