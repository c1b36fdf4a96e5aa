// LayoutIndex: the step's layout index for a restore into another layout
// (doc/resharding.md). See restorer.h.
#include <algorithm>
#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/restorer.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "util/log.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// The node manifests of a step in one tier, each with the index of the
// pieces of its ranks. A manifest that does not read or validate is an
// error naming its key (a shared root's torn or foreign file is not
// skipped silently: the index would then miss ranks for an unclear
// reason).
struct ManifestIndex {
  std::string key;
  storage::v1::NodeManifest manifest;
  std::optional<storage::LayoutIndex> index;  // none: the step has no layout
};

absl::StatusOr<std::vector<ManifestIndex>> ReadManifests(
    storage::Backend& backend, const std::string& job, uint64_t step) {
  std::vector<ManifestIndex> out;
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                        backend.List(storage::StepPrefix(job, step)));
  for (const std::string& key : keys) {
    absl::StatusOr<storage::ParsedKey> k = storage::ParseKey(key);
    if (!k.ok() || k->kind != storage::KeyKind::kManifest) continue;
    ManifestIndex m;
    m.key = key;
    CKPT_ASSIGN_OR_RETURN(m.manifest, storage::ReadNodeManifest(backend, key));
    if (!m.manifest.layout_index().empty()) {
      // DecodeNodeManifest parsed it already; parsed again for the pieces.
      absl::StatusOr<storage::LayoutIndex> index =
          storage::ParseLayoutIndex(m.manifest.layout_index());
      if (!index.ok())
        return absl::DataLossError(
            absl::StrCat(key, ": layout_index: ", index.status().message()));
      m.index = std::move(*index);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

absl::StatusOr<v1::LayoutIndexResponse> Restorer::LayoutIndex(
    const PeerCreds& peer, const v1::LayoutIndexRequest& req) {
  // The coordinator's merged index of the committed step first: one answer
  // whatever this node holds; without one (an older coordinator, a step
  // not committed, no coordinator reachable) the index is built here.
  if (node_.options.step_index) {
    absl::StatusOr<v1::LayoutIndexResponse> resp =
        LayoutIndexFromCoordinator(peer, req);
    if (resp.ok()) return resp;
    if (!absl::IsNotFound(resp.status()))
      LogInfo(absl::StrCat("layout index of job '", req.job(), "' step ",
                           req.step(), ": ", resp.status().message(),
                           "; built from this node and the node manifests"));
  }
  // Saved ranks no shard here and no node manifest describes are fetched
  // from the peers holding them in memory (a cluster without a shared
  // root), and the index built again: a job this node has no shard of
  // learns its saved world size from the first rank fetched (rank 0),
  // then the others. At most three rounds.
  for (int round = 0;; ++round) {
    std::vector<uint32_t> absent;
    bool job_here = true;
    absl::StatusOr<v1::LayoutIndexResponse> resp =
        LayoutIndexHere(peer, req, &absent, &job_here);
    if (resp.ok() || !absl::IsNotFound(resp.status()) ||
        !node_.options.fetch_from_peers || round == 2)
      return resp;
    if (!job_here) absent = {0};
    if (absent.empty()) return resp;
    // The ranks are fetched in parallel (each from its own peer, as a
    // PREFETCH's ranks load), at most kFetchThreads at a time.
    constexpr size_t kFetchThreads = 8;
    std::vector<absl::Status> results(absent.size());
    std::atomic<size_t> next{0};
    auto fetch = [&] {
      for (size_t i = next.fetch_add(1); i < absent.size();
           i = next.fetch_add(1))
        results[i] = FetchSavedRankFromPeers(req.job(), req.step(), absent[i]);
    };
    std::vector<std::thread> threads;
    for (size_t t = 1; t < std::min(kFetchThreads, absent.size()); ++t)
      threads.emplace_back(fetch);
    fetch();
    for (std::thread& t : threads) t.join();
    std::vector<std::string> failed;
    for (size_t i = 0; i < absent.size(); ++i)
      if (!results[i].ok())
        failed.push_back(
            absl::StrCat("rank ", absent[i], ": ", results[i].message()));
    if (!failed.empty())
      return absl::NotFoundError(
          absl::StrCat(resp.status().message(),
                       "; from peers' memory: ", absl::StrJoin(failed, "; ")));
  }
}

absl::StatusOr<v1::LayoutIndexResponse> Restorer::LayoutIndexFromCoordinator(
    const PeerCreds& peer, const v1::LayoutIndexRequest& req) {
  {
    // The caller may see the job (as LayoutIndexHere checks).
    Section lock(&node_);
    CKPT_RETURN_IF_ERROR(node_.table.FindFor(req.job(), peer).status());
  }
  CKPT_ASSIGN_OR_RETURN(std::string blob,
                        node_.options.step_index(req.job(), req.step()));
  // Checked as any input (the client parses it again).
  absl::StatusOr<storage::LayoutIndex> index = storage::ParseLayoutIndex(blob);
  if (!index.ok())
    return absl::DataLossError(absl::StrCat("the coordinator's layout index: ",
                                            index.status().message()));
  const uint32_t world_size = index->world_size();
  v1::LayoutIndexResponse resp;
  resp.set_world_size(world_size);
  resp.set_from_coordinator(true);
  {
    // The saved ranks held here, of the step's world size.
    Section lock(&node_);
    CKPT_ASSIGN_OR_RETURN(Job * job, node_.table.FindFor(req.job(), peer));
    auto step = job->steps.find(req.step());
    if (step != job->steps.end())
      for (const auto& [r, shard] : step->second.shards)
        if (r < world_size && (shard.rec.world_size() == 0 ||
                               shard.rec.world_size() == world_size))
          resp.add_local_ranks(r);
  }
  LogInfo(absl::StrCat("layout index of job '", req.job(), "' step ",
                       req.step(), ": the coordinator's (", index->num_pieces(),
                       " pieces of ", world_size, " saved ranks)"));
  resp.set_index(std::move(blob));
  return resp;
}

absl::StatusOr<v1::LayoutIndexResponse> Restorer::LayoutIndexHere(
    const PeerCreds& peer, const v1::LayoutIndexRequest& req,
    std::vector<uint32_t>* absent_out, bool* job_here) {
  // What this node holds, copied under the lock.
  uint32_t world_size = 0;
  std::vector<std::vector<v1::TensorMeta>> metas;
  std::vector<bool> held;
  bool left_out_older = false;  // shards of an abandoned timeline
  {
    Section lock(&node_);
    absl::StatusOr<Job*> found = node_.table.FindFor(req.job(), peer);
    if (absl::IsNotFound(found.status())) *job_here = false;
    CKPT_ASSIGN_OR_RETURN(Job * job, found);
    // The step's own world size (its shards record it): a job that runs
    // at another world size now restores a step saved at the old one.
    world_size = job->rec.world_size();
    auto step = job->steps.find(req.step());
    if (step != job->steps.end()) {
      // A step number saved again by a resized job (a newer generation)
      // after an abandoned timeline saved it at another world size: the
      // newest generation's shards are the step, the older ones of
      // another world size are left out (a job that grows back restores
      // the step its smaller self committed).
      uint64_t newest = 0;
      for (const auto& [r, shard] : step->second.shards)
        if (shard.rec.world_size() != 0)
          newest = std::max<uint64_t>(newest, shard.rec.generation());
      for (const auto& [r, shard] : step->second.shards) {
        if (shard.rec.world_size() != 0 && shard.rec.generation() == newest) {
          world_size = shard.rec.world_size();
          break;
        }
      }
      metas.resize(world_size);
      held.assign(world_size, false);
      for (const auto& [r, shard] : step->second.shards) {
        if (shard.rec.world_size() != 0 &&
            shard.rec.world_size() != world_size &&
            shard.rec.generation() < newest) {
          left_out_older = true;
          continue;
        }
        if (shard.rec.world_size() != 0 && shard.rec.world_size() != world_size)
          return absl::DataLossError(absl::StrCat(
              "step ", req.step(), ": rank ", r, " was saved at world_size ",
              shard.rec.world_size(), ", another rank at ", world_size));
        if (r >= world_size) continue;
        metas[r].assign(shard.rec.tensors().begin(), shard.rec.tensors().end());
        held[r] = true;
      }
    } else {
      metas.resize(world_size);
      held.assign(world_size, false);
    }
  }
  if (world_size == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("job '", req.job(), "' has world_size 0"));
  // A whole tensor (no layout) that ranks saved with other dtypes or
  // shapes is each rank's own (a skeleton, an RNG state): no global tensor
  // to reshard, so left out of the index instead of failing it.
  {
    struct Seen {
      uint32_t dtype;
      std::vector<uint64_t> shape;
      bool conflict = false;
    };
    std::map<std::string, Seen> whole;
    for (const auto& rank : metas)
      for (const v1::TensorMeta& m : rank) {
        if (m.global_shape_size() != 0 || !m.global_name().empty()) continue;
        std::vector<uint64_t> shape(m.shape().begin(), m.shape().end());
        auto [it, added] = whole.try_emplace(m.name(), Seen{m.dtype(), shape});
        if (!added &&
            (it->second.dtype != m.dtype() || it->second.shape != shape))
          it->second.conflict = true;
      }
    for (auto& rank : metas)
      std::erase_if(rank, [&](const v1::TensorMeta& m) {
        if (m.global_shape_size() != 0 || !m.global_name().empty())
          return false;
        auto it = whole.find(m.name());
        return it != whole.end() && it->second.conflict;
      });
  }
  storage::LayoutIndexBuilder b(world_size);
  v1::LayoutIndexResponse resp;
  resp.set_world_size(world_size);
  bool any_held = false;
  for (uint32_t r = 0; r < world_size; ++r) {
    if (!held[r]) continue;
    any_held = true;
    resp.add_local_ranks(r);
    if (absl::Status s =
            storage::AddShardPieces(b, r, metas[r], absl::StrCat("rank ", r));
        !s.ok())
      return absl::DataLossError(
          absl::StrCat("layout index of step ", req.step(), ": ", s.message()));
  }
  // The other ranks from the node manifests: the root (a shared root in a
  // cluster), then the object tier.
  std::vector<std::string> undescribed;
  std::vector<bool> described = held;
  auto missing = [&] {
    return std::find(described.begin(), described.end(), false) !=
           described.end();
  };
  std::vector<storage::Backend*> tiers = {node_.backend};
  if (node_.object != nullptr) tiers.push_back(node_.object);
  for (storage::Backend* tier : tiers) {
    if (!missing()) break;
    absl::StatusOr<std::vector<ManifestIndex>> ms =
        ReadManifests(*tier, req.job(), req.step());
    if (!ms.ok())
      return Annotate(ms.status(),
                      absl::StrCat("layout index of step ", req.step(), ": ",
                                   tier->name()));
    for (const ManifestIndex& m : *ms) {
      // The abandoned timeline's node manifests go with its shards.
      if (m.manifest.world_size() != world_size && left_out_older) continue;
      if (m.manifest.world_size() != world_size)
        return absl::DataLossError(absl::StrCat(m.key, ": world_size ",
                                                m.manifest.world_size(),
                                                ", the job has ", world_size));
      for (const auto& shard : m.manifest.shards()) {
        const uint32_t r = shard.rank();
        if (r >= world_size || described[r]) continue;
        if (!m.index) {
          undescribed.push_back(
              absl::StrCat("rank ", r, " (", m.key, " has no layout_index)"));
          continue;
        }
        if (absl::Status s = storage::AddIndexPieces(b, *m.index, r, m.key);
            !s.ok())
          return absl::DataLossError(absl::StrCat(
              "layout index of step ", req.step(), ": ", s.message()));
        described[r] = true;
      }
    }
  }
  std::vector<uint32_t> absent;
  for (uint32_t r = 0; r < world_size; ++r)
    if (!described[r]) absent.push_back(r);
  if (!any_held && !std::count(described.begin(), described.end(), true)) {
    // Nothing of the step here: its saved world size is not known (the
    // job's is a guess), so only rank 0 is a sure part of it.
    *absent_out = {0};
    return absl::NotFoundError(
        absl::StrCat("step: job '", req.job(), "' has no step ", req.step()));
  }
  // The step is not complete here: NotFound, as for a step no rank saved
  // (a restore then answers what its own shard said).
  *absent_out = absent;
  if (!absent.empty())
    return absl::NotFoundError(absl::StrCat(
        "layout index of job '", req.job(), "' step ", req.step(),
        ": saved ranks [", absl::StrJoin(absent, ", "), "] of ", world_size,
        " are described by no shard here and no node manifest",
        undescribed.empty() ? "" : "; ", absl::StrJoin(undescribed, "; ")));
  absl::StatusOr<storage::LayoutIndex> index = std::move(b).Finish();
  if (!index.ok())
    return absl::DataLossError(absl::StrCat("layout index of step ", req.step(),
                                            ": ", index.status().message()));
  resp.set_index(storage::SerializeLayoutIndex(*index));
  return resp;
}

absl::Status Restorer::FetchSavedRankFromPeers(const std::string& job,
                                               uint64_t step, uint32_t rank) {
  if (!node_.options.fetch_from_peers)
    return absl::NotFoundError("no coordinator to name a peer");
  {
    // One fetch of a rank at a time: a restore that finds one running
    // waits for it and uses its copy.
    Section lock(&node_);
    CKPT_RETURN_IF_ERROR(WaitFetch(job, step, rank));
    if (const Shard* s = node_.table.FindShard(job, step, rank);
        s != nullptr && s->slot >= 0)
      return absl::OkStatus();
    node_.table.BeginFetch(job, step, rank);
  }
  absl::Status st = node_.options.fetch_from_peers(job, step, rank);
  Section lock(&node_);
  node_.table.EndFetch(job, step, rank);
  return st;
}

absl::StatusOr<Restorer::ManifestShard> Restorer::FindInNodeManifests(
    const std::string& job, uint64_t step, uint32_t rank,
    std::vector<std::string>* tried) {
  // The root (a shared root in a cluster), then the object tier.
  std::vector<storage::Backend*> tiers = {node_.backend};
  if (node_.object != nullptr) tiers.push_back(node_.object);
  for (storage::Backend* tier : tiers) {
    absl::StatusOr<std::vector<ManifestIndex>> ms =
        ReadManifests(*tier, job, step);
    if (!ms.ok())
      return Annotate(ms.status(),
                      absl::StrCat("saved rank ", rank, " of step ", step, ": ",
                                   tier->name()));
    for (const ManifestIndex& m : *ms)
      for (int i = 0; i < m.manifest.shards_size(); ++i)
        if (m.manifest.shards(i).rank() == rank)
          return ManifestShard{tier, m.key, m.manifest.world_size(),
                               m.manifest.shards(i),
                               absl::StrCat(m.key, ": shards[", i, "]")};
    tried->push_back(
        absl::StrCat(tier == node_.backend ? "the root" : "the object tier",
                     ": no node manifest names it"));
  }
  return absl::NotFoundError(absl::StrCat("saved rank ", rank, " of step ",
                                          step, ": ",
                                          absl::StrJoin(*tried, "; ")));
}

absl::Status Restorer::FetchSavedRank(const std::string& job, uint64_t step,
                                      uint32_t rank) {
  // A peer's memory first (the owner's slot, a replica), then the keys
  // the step's node manifests name in the root and the object tier.
  std::vector<std::string> tried;
  if (node_.options.fetch_from_peers) {
    absl::Status st = FetchSavedRankFromPeers(job, step, rank);
    if (st.ok()) return st;
    tried.push_back(absl::StrCat("peers: ", st.message()));
  }
  const size_t peers = tried.size();
  CKPT_ASSIGN_OR_RETURN(ManifestShard m,
                        FindInNodeManifests(job, step, rank, &tried));
  tried.resize(peers);
  return Annotate(
      Prefetch(job, m.world_size, step, rank, m.shard.key(), std::nullopt),
      absl::StrCat("saved rank ", rank, " of step ", step, " from ",
                   m.shard.key(), tried.empty() ? "" : " (",
                   absl::StrJoin(tried, "; "), tried.empty() ? "" : ")"));
}

}  // namespace ckpt::daemon
