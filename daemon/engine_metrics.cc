// The engine's gauges for a scrape (metrics.h). See engine.h.
#include "daemon/engine.h"

namespace ckpt::daemon {

MetricsSnapshot Engine::Snapshot() {
  MetricsSnapshot snap;
  MetricsSnapshot::Backlog& local =
      snap.backlog[std::string(metric::kTierLocal)];
  std::lock_guard<std::mutex> lock(table_.mu());
  for (const auto& [name, job] : table_.jobs()) {
    MetricsSnapshot::Job& g = snap.jobs[name];
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.arena) continue;
      ++g.arenas;
      g.shm_bytes += rank.arena->size();
    }
    for (const auto& [n, step] : job.steps) {
      bool pending = false;
      for (const auto& [r, shard] : step.shards) {
        if (shard.phase != ShardPhase::kStaged &&
            shard.phase != ShardPhase::kPersisting)
          continue;
        pending = true;
        ++local.shards;
        local.bytes += shard.rec.image_bytes();
      }
      if (pending) ++local.steps;
    }
  }
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
