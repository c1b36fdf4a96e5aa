// Retention decisions and the node manifest. See retention.h.
#include "daemon/core/retention.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <string_view>

#include "daemon/core/engine_util.h"
#include "storage/manifest.h"
#include "util/checksum.h"

namespace ckpt::daemon {

bool StepComplete(const Step& step, uint32_t world_size, const Hosting* hosting,
                  bool* durable) {
  *durable = true;
  bool whole = true;
  if (hosting == nullptr) {
    whole = step.shards.size() == world_size;
  } else {
    // Cluster mode: only the ranks this node hosts count here.
    whole = !hosting->ranks.empty();
    for (uint32_t r : hosting->ranks) whole = whole && step.shards.count(r);
  }
  if (!whole) {
    *durable = false;
    return false;
  }
  for (const auto& [r, shard] : step.shards) {
    // A shard whose persist failed for good (e.g. its checksums did not
    // match its bytes) makes the step unusable, even if still in memory.
    if (shard.phase == ShardPhase::kFailed) {
      *durable = false;
      return false;
    }
    if (shard.phase != ShardPhase::kDurable) *durable = false;
    if (shard.phase != ShardPhase::kDurable && shard.slot < 0) return false;
  }
  return true;
}

std::optional<uint64_t> RetentionCutoff(const std::map<uint64_t, Step>& steps,
                                        uint32_t retain_steps, bool cluster,
                                        const Hosting* hosting, bool object) {
  if (retain_steps == 0) return std::nullopt;
  uint32_t kept = 0;
  uint64_t oldest_kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (!(object ? it->second.object_manifest : it->second.manifest)) continue;
    oldest_kept = it->first;
    if (++kept == retain_steps) break;
  }
  if (kept < retain_steps) return std::nullopt;
  if (cluster) {
    // The job may still restore steps this node already counts as old
    // (another node lags), so the coordinator's word counts.
    if (hosting == nullptr || !hosting->keep_from) return std::nullopt;
    oldest_kept = std::min(oldest_kept, *hosting->keep_from);
  }
  return oldest_kept;
}

std::vector<uint64_t> BrokenStepsToDrop(const std::map<uint64_t, Step>& steps,
                                        uint32_t retain_steps,
                                        const Hosting* hosting) {
  std::vector<uint64_t> out;
  if (retain_steps == 0 || steps.size() <= retain_steps) return out;
  auto newest_kept = std::prev(steps.end(), retain_steps);
  for (auto it = steps.begin(); it != newest_kept; ++it) {
    if (hosting != nullptr && hosting->keep_from == it->first) continue;
    for (const auto& [r, shard] : it->second.shards)
      if (shard.phase == ShardPhase::kFailed) {
        out.push_back(it->first);
        break;
      }
  }
  return out;
}

std::vector<std::pair<uint32_t, uint64_t>> ShardGenerations(const Step& step) {
  std::vector<std::pair<uint32_t, uint64_t>> gens;
  for (const auto& [r, shard] : step.shards) gens.emplace_back(r, shard.gen);
  return gens;
}

storage::v1::NodeManifest NodeManifestOf(const std::string& job,
                                         uint64_t step_no, uint32_t world_size,
                                         const Step& step) {
  storage::v1::NodeManifest m;
  m.set_job(job);
  m.set_step(step_no);
  m.set_world_size(world_size);
  for (const auto& [r, shard] : step.shards) {
    storage::v1::NodeManifestShard* ms = m.add_shards();
    ms->set_rank(r);
    ms->set_key(shard.rec.path());
    ms->set_bytes(shard.rec.image_bytes());
    ms->set_tensors(static_cast<uint32_t>(shard.rec.tensors_size()));
    ms->set_checksums_digest(
        storage::DigestHex(storage::ChecksumsDigest(shard.info)));
    // The chunk hashes the save sent (checked at commit to combine into
    // each tensor's checksum), by the tensor's place in the shard's index:
    // a node that never held this record verifies ranges with them
    // (doc/resharding.md, "A lost node's saved rank").
    std::map<std::string_view, const v1::TensorMeta*> metas;
    for (const v1::TensorMeta& t : shard.rec.tensors())
      if (t.chunk_hashes_size() != 0) metas.emplace(t.name(), &t);
    for (size_t i = 0; i < shard.info.tensors.size() && !metas.empty(); ++i) {
      const storage::ShardTensor& t = shard.info.tensors[i];
      auto it = metas.find(t.name);
      if (it == metas.end() ||
          static_cast<uint64_t>(it->second->chunk_hashes_size()) !=
              ChecksumChunks(t.bytes))
        continue;
      storage::AddChunkHashes(
          ms, static_cast<uint32_t>(i),
          {it->second->chunk_hashes().data(),
           static_cast<size_t>(it->second->chunk_hashes_size())});
    }
  }
  return m;
}

namespace {

// The steps below `cutoff`, then the broken ones at or above it (retention
// of `retain_steps`): in step order.
std::vector<uint64_t> StepsToDrop(const std::map<uint64_t, Step>& steps,
                                  std::optional<uint64_t> cutoff,
                                  uint32_t retain_steps,
                                  const Hosting* hosting) {
  std::vector<uint64_t> doomed;
  for (const auto& [n, step] : steps)
    if (cutoff && n < *cutoff) doomed.push_back(n);
  // Steps that can never be whole do not count towards retain_steps, so
  // without this a rank that fails every persist would fill the disk.
  for (uint64_t n : BrokenStepsToDrop(steps, retain_steps, hosting))
    if (!cutoff || n >= *cutoff) doomed.push_back(n);
  return doomed;
}

}  // namespace

std::vector<std::pair<uint64_t, uint32_t>> ShardsToDrop(
    const std::map<uint64_t, Step>& steps, uint32_t retain_steps, bool cluster,
    const Hosting* hosting) {
  std::vector<std::pair<uint64_t, uint32_t>> doomed;
  for (uint64_t n : StepsToDrop(
           steps, RetentionCutoff(steps, retain_steps, cluster, hosting),
           retain_steps, hosting))
    for (const auto& [r, shard] : steps.at(n).shards) doomed.emplace_back(n, r);
  return doomed;
}

std::vector<uint64_t> ObjectTierStepsToDrop(
    const std::map<uint64_t, Step>& steps, uint32_t retain_object,
    uint32_t retain_steps, bool cluster, const Hosting* hosting) {
  return StepsToDrop(steps,
                     RetentionCutoff(steps, retain_object, cluster, hosting,
                                     /*object=*/true),
                     retain_steps, hosting);
}

LocalTierDrops LocalTierDropsOf(const std::map<uint64_t, Step>& steps,
                                uint32_t retain_steps, uint32_t world_size,
                                bool cluster, const Hosting* hosting) {
  LocalTierDrops drops;
  std::optional<uint64_t> cutoff =
      RetentionCutoff(steps, retain_steps, cluster, hosting, /*object=*/false);
  if (!cutoff) return drops;
  for (const auto& [n, step] : steps) {
    if (n >= *cutoff) break;
    // Only a copy the object tier holds may go.
    bool uploaded = step.object_manifest;
    for (const auto& [r, shard] : step.shards)
      uploaded = uploaded && shard.uploaded;
    bool durable = false;
    if (uploaded)
      drops.local_only.push_back(n);
    else if (!StepComplete(step, world_size, hosting, &durable))
      drops.whole.push_back(n);
  }
  return drops;
}

}  // namespace ckpt::daemon
