// The engine's gauges for a scrape (metrics.h). See engine.h.
#include "daemon/engine.h"

namespace ckpt::daemon {

MetricsSnapshot Engine::Snapshot() {
  MetricsSnapshot snap;
  MetricsSnapshot::Backlog& local =
      snap.backlog[std::string(metric::kTierLocal)];
  Section lock(this);
  table_.ForEachVisible(/*uid=*/0, /*only=*/"", [&](const Job& job) {
    MetricsSnapshot::Job& g = snap.jobs[job.rec.job()];
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.arena) continue;
      ++g.arenas;
      g.shm_bytes += rank.arena->size();
      if (rank.arena->huge_pages()) ++g.huge_page_arenas;
    }
    const JobTable::InFlight in = JobTable::InFlightOf(job);
    local.steps += in.steps;
    local.shards += in.shards;
    local.bytes += in.bytes;
  });
  if (uploader_) {
    // The object tier's queue (its own lock; lock order engine -> uploader).
    const UploadBacklog b = uploader_->Backlog();
    MetricsSnapshot::Backlog& object =
        snap.backlog[std::string(metric::kTierObject)];
    object.steps = b.steps;
    object.shards = b.shards;
    object.bytes = b.bytes;
  }
  return snap;
}

}  // namespace ckpt::daemon
