// Retention's decisions applied, in one tier or both (the decisions are
// retention.h's), and the manifests, uploads and deletes a durable step or
// shard queues. See node_state.h; the tiers are described in
// doc/object-tier.md.
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/retention.h"
#include "daemon/state/node_state.h"

namespace ckpt::daemon {

void NodeState::MaybeQueueManifest(Job& job, uint64_t step_no) {
  if (!table.ManifestDue(job, step_no)) return;
  persister->Push(
      PersistTask{PersistTask::kManifest, job.rec.job(), step_no, 0, 0, {}});
}

void NodeState::ApplyRetention(Job& job) {
  const Hosting* hosting = table.HostingOf(job.rec.job());
  if (object != nullptr) {
    ApplyTieredRetention(job, hosting);
    return;
  }
  for (auto [n, r] : ShardsToDrop(job.steps, options.retain_steps,
                                  !options.node_id.empty(), hosting))
    DropShard(job, n, r, /*delete_file=*/true);
}

void NodeState::QueueUpload(const Job& job, const Shard& shard) {
  if (std::optional<UploadTask> t = JobTable::UploadOf(job, shard))
    uploader->Push(std::move(*t));
}

void NodeState::QueueObjectDelete(Job& job, uint64_t step_no) {
  auto step = job.steps.find(step_no);
  if (step == job.steps.end()) return;
  UploadTask del{UploadTask::kDelete, job.rec.job(), step_no};
  // The manifest goes whether or not this daemon saw it written: an upload
  // that raced a delete must not leave a visible step.
  del.keys.push_back(NodeManifestKey(job.rec.job(), step_no));
  for (const auto& [r, shard] : step->second.shards)
    if (shard.uploaded) del.keys.push_back(shard.rec.path());
  shard_drops->QueueObjectDelete(std::move(del));
  step->second.object_manifest = false;
  for (auto& [r, shard] : step->second.shards) shard.uploaded = false;
}

void NodeState::DropLocalCopy(Job& job, uint64_t step_no) {
  for (auto& [r, shard] : job.steps[step_no].shards)
    if (!shard.local_gone && shard.phase == ShardPhase::kDurable)
      DropLocalShard(job, step_no, shard);
}

void NodeState::DropLocalShard(Job& job, uint64_t step_no, Shard& shard) {
  Step& step = job.steps[step_no];
  if (step.manifest) {  // the step is not whole on local disk any more
    shard_drops->QueueLocalDelete(
        job.rec.job(), step_no, NodeManifestKey(job.rec.job(), step_no), false);
    step.manifest = false;
  }
  shard_drops->QueueLocalDelete(job.rec.job(), step_no, shard.rec.path(),
                                false);
  shard.local_gone = true;
  shard.rec.set_local_gone(true);
  CatalogEdit edit;
  edit.PutShard(shard.rec);
  QueueEdit(std::move(edit), /*sync=*/false);
}

void NodeState::ApplyTieredRetention(Job& job, const Hosting* hosting) {
  const bool cluster = !options.node_id.empty();
  auto drop_step = [&](uint64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu()) {
    std::vector<uint32_t> ranks;
    for (const auto& [r, shard] : job.steps[n].shards) ranks.push_back(r);
    for (uint32_t r : ranks) DropShard(job, n, r, /*delete_file=*/true);
  };
  // The object tier first: whole steps go from both tiers, the object
  // manifest first (retention.h's ObjectTierStepsToDrop decides).
  for (uint64_t n :
       ObjectTierStepsToDrop(job.steps, options.retain_object,
                             options.retain_steps, cluster, hosting)) {
    QueueObjectDelete(job, n);
    drop_step(n);
  }
  // Then the local tier, over what is left (LocalTierDropsOf).
  const LocalTierDrops local = LocalTierDropsOf(
      job.steps, options.retain_steps, job.rec.world_size(), cluster, hosting);
  for (uint64_t n : local.local_only) DropLocalCopy(job, n);
  for (uint64_t n : local.whole) drop_step(n);
}

}  // namespace ckpt::daemon
