// Coordinator: failure detection, recovery plans, orders, and the global
// commit of a step (manifest first, then last good).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/coordinator/coordinator.h"
#include "storage/manifest.h"

namespace ckpt::coordinator {

void Coordinator::DetectTimeoutsLocked(Batch* batch) {
  const int64_t now = options_.now_ms();
  const int64_t timeout = options_.heartbeat_timeout.count();
  // Every node that timed out is dead before any plan is made, so that no
  // plan hands ranks to a node that is about to be declared dead too.
  std::vector<std::string> dead;
  for (auto& [id, node] : nodes_) {
    if (node.rec.health() != v1::ALIVE || now - node.last_heartbeat_ms <= timeout) continue;
    DeclareDeadLocked(batch, node, absl::StrCat("no heartbeat for ", now - node.last_heartbeat_ms, " ms"));
    dead.push_back(id);
  }
  for (auto& [name, job] : jobs_)
    for (const std::string& id : dead)
      if (std::find(job.rec.rank_node().begin(), job.rec.rank_node().end(), id) != job.rec.rank_node().end()) {
        MakePlanLocked(batch, job, absl::StrCat("node ", absl::StrJoin(dead, ","), " dead"));
        break;
      }
}

void Coordinator::DeclareDeadLocked(Batch* batch, NodeState& node, const std::string& reason) {
  const std::string id = node.rec.node_id();
  node.rec.set_health(v1::DEAD);
  node.rec.set_dead_reason(reason);
  batch->PutNode(node.rec);
  LogLocked(batch, v1::FAILURE_DETECTED, "", id,
            absl::StrCat("node ", id, " epoch ", node.rec.epoch(), " declared dead: ", reason));
  for (auto it = orders_.begin(); it != orders_.end();) {
    if (it->second.node_id() == id) {
      batch->DeleteOrder(it->first);
      it = orders_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Coordinator::InHostMemoryLocked(const JobState& job, uint64_t step, uint32_t rank) const {
  auto st = job.steps.find(step);
  if (st == job.steps.end()) return false;
  auto sh = st->second.find(rank);
  if (sh == st->second.end()) return false;
  auto host = nodes_.find(job.rec.rank_node(rank));
  return host != nodes_.end() && host->second.rec.health() == v1::ALIVE &&
         sh->second.node_id() == host->first && sh->second.epoch() == host->second.rec.epoch();
}

std::optional<uint64_t> Coordinator::RestoreStepLocked(const JobState& job) const {
  for (auto st = job.steps.rbegin(); st != job.steps.rend(); ++st) {
    bool every_rank = st->second.size() == job.rec.world_size();
    for (uint32_t r = 0; every_rank && r < job.rec.world_size(); ++r) {
      auto sh = st->second.find(r);
      every_rank = sh != st->second.end() &&
                   (sh->second.state() == v1::DURABLE || InHostMemoryLocked(job, st->first, r));
    }
    if (every_rank) return st->first;
  }
  // Shard records of the last good step may be gone (a rollback to an older
  // manifest); its manifest still names every shard.
  if (job.rec.has_last_good()) return job.rec.last_good_step();
  return std::nullopt;
}

void Coordinator::DropStepsAfterLocked(Batch* batch, JobState& job, std::optional<uint64_t> step) {
  for (auto st = job.steps.begin(); st != job.steps.end();) {
    if (step && st->first <= *step) {
      ++st;
      continue;
    }
    for (const auto& [rank, rec] : st->second) batch->DeleteShard(job.rec.job(), st->first, rank);
    st = job.steps.erase(st);
  }
}

void Coordinator::DropOrdersOfJobLocked(Batch* batch, const std::string& job) {
  for (auto it = orders_.begin(); it != orders_.end();) {
    // STOP orders to dead nodes stay: they tell a returning node which
    // ranks it lost.
    if (it->second.job() == job && it->second.kind() != v1::STOP) {
      batch->DeleteOrder(it->first);
      it = orders_.erase(it);
    } else {
      ++it;
    }
  }
}

void Coordinator::MakePlanLocked(Batch* batch, JobState& job, const std::string& cause) {
  const std::string& name = job.rec.job();
  job.rec.set_generation(job.rec.generation() + 1);
  DropOrdersOfJobLocked(batch, name);
  // Group the ranks of dead hosts by host; move each group to a spare.
  std::map<std::string, std::vector<uint32_t>> lost;
  for (uint32_t r = 0; r < job.rec.world_size(); ++r) {
    auto host = nodes_.find(job.rec.rank_node(r));
    if (host == nodes_.end() || host->second.rec.health() != v1::ALIVE) lost[job.rec.rank_node(r)].push_back(r);
  }
  job.rec.clear_lost_ranks();
  std::vector<std::string> moves;
  for (const auto& [dead, ranks] : lost) {
    NodeState* spare = nullptr;
    for (auto& [id, n] : nodes_) {
      if (n.rec.health() == v1::ALIVE && n.rec.spare() && n.rec.capacity() >= HostedRanksLocked(id) + ranks.size()) {
        spare = &n;
        break;
      }
    }
    if (!spare) {
      job.rec.mutable_lost_ranks()->Add(ranks.begin(), ranks.end());
      continue;
    }
    for (uint32_t r : ranks) job.rec.set_rank_node(r, spare->rec.node_id());
    spare->rec.set_spare(false);
    batch->PutNode(spare->rec);
    moves.push_back(absl::StrCat("ranks ", absl::StrJoin(ranks, ","), " ", dead, "->", spare->rec.node_id()));
    v1::Order stop;
    stop.set_node_id(dead);
    stop.set_kind(v1::STOP);
    stop.set_job(name);
    stop.mutable_ranks()->Add(ranks.begin(), ranks.end());
    stop.set_generation(job.rec.generation());
    stop.set_world_size(job.rec.world_size());
    QueueOrderLocked(batch, std::move(stop));
  }
  if (!job.rec.lost_ranks().empty()) {
    job.rec.set_plan_state(v1::PLAN_WAITING_FOR_NODE);
    batch->PutJob(job.rec);
    LogLocked(batch, v1::PLAN_WAITING, name, "",
              absl::StrCat("generation ", job.rec.generation(), " (", cause, "): ranks ",
                           absl::StrJoin(job.rec.lost_ranks(), ","), " have no host; waiting for a spare or their node"));
    return;
  }
  std::optional<uint64_t> step = RestoreStepLocked(job);
  DropStepsAfterLocked(batch, job, step);
  std::optional<storage::v1::GlobalManifest> manifest;
  if (step && job.steps.count(*step) == 0) {
    absl::StatusOr<storage::v1::GlobalManifest> m = storage::ReadGlobalManifest(*shared_, name, *step);
    if (m.ok()) manifest = std::move(*m);
    else LogLocked(batch, v1::MANIFEST_INVALID, name, "", std::string(m.status().message()));
  }
  LogLocked(batch, v1::PLAN_MADE, name, "",
            absl::StrCat("generation ", job.rec.generation(), " (", cause, "): restore ",
                         step ? absl::StrCat("step ", *step) : std::string("from scratch"),
                         moves.empty() ? "" : "; ", absl::StrJoin(moves, "; ")));
  IssueOrdersLocked(batch, job, step, manifest ? &*manifest : nullptr);
}

void Coordinator::IssueOrdersLocked(Batch* batch, JobState& job, std::optional<uint64_t> step,
                                    const storage::v1::GlobalManifest* manifest) {
  const std::string& name = job.rec.job();
  std::map<std::string, std::vector<uint32_t>> ranks_by_host;
  for (uint32_t r = 0; r < job.rec.world_size(); ++r) ranks_by_host[job.rec.rank_node(r)].push_back(r);
  for (const auto& [host, ranks] : ranks_by_host) {
    v1::Order base;
    base.set_node_id(host);
    base.set_job(name);
    base.set_has_step(step.has_value());
    base.set_step(step.value_or(0));
    base.set_generation(job.rec.generation());
    base.set_world_size(job.rec.world_size());
    if (step) {
      v1::Order prefetch = base;
      prefetch.set_kind(v1::PREFETCH);
      for (uint32_t r : ranks) {
        if (InHostMemoryLocked(job, *step, r)) continue;
        std::string key;
        auto st = job.steps.find(*step);
        if (st != job.steps.end() && st->second.count(r) && st->second.at(r).state() == v1::DURABLE)
          key = st->second.at(r).key();
        if (key.empty() && manifest)
          for (const auto& s : manifest->shards())
            if (s.rank() == r) key = s.key();
        prefetch.add_ranks(r);
        prefetch.add_shard_keys(key);
      }
      if (!prefetch.ranks().empty()) QueueOrderLocked(batch, std::move(prefetch));
    }
    v1::Order restart = base;
    restart.set_kind(v1::RESTART);
    restart.mutable_ranks()->Add(ranks.begin(), ranks.end());
    QueueOrderLocked(batch, std::move(restart));
  }
  job.rec.set_plan_state(v1::PLAN_ORDERED);
  job.rec.set_has_restore_step(step.has_value());
  job.rec.set_restore_step(step.value_or(0));
  batch->PutJob(job.rec);
}

void Coordinator::UpdatePlanProgressLocked(Batch* batch, JobState& job) {
  if (job.rec.plan_state() != v1::PLAN_ORDERED) return;
  for (const auto& [id, o] : orders_)
    if (o.job() == job.rec.job() && o.kind() != v1::STOP) return;
  job.rec.set_plan_state(v1::PLAN_ACKNOWLEDGED);
  batch->PutJob(job.rec);
  LogLocked(batch, v1::PLAN_ACKED, job.rec.job(), "",
            absl::StrCat("generation ", job.rec.generation(), ": every order acknowledged"));
}

absl::Status Coordinator::MaybeCommitStepLocked(Batch* batch, JobState& job, uint64_t step,
                                                v1::ReportShardResponse* resp) {
  const auto& shards = job.steps[step];
  if (shards.size() != job.rec.world_size()) return absl::OkStatus();
  for (const auto& [rank, rec] : shards)
    if (rec.state() != v1::DURABLE) return absl::OkStatus();
  resp->set_durable_everywhere(true);
  const auto& done = job.rec.manifest_steps();
  if (std::find(done.begin(), done.end(), step) != done.end()) return absl::OkStatus();
  storage::v1::GlobalManifest m;
  m.set_format(storage::kGlobalManifestFormat);
  m.set_job(job.rec.job());
  m.set_step(step);
  m.set_world_size(job.rec.world_size());
  uint64_t total = 0;
  for (const auto& [rank, rec] : shards) {
    storage::v1::ManifestShard* s = m.add_shards();
    s->set_rank(rank);
    s->set_key(rec.key());
    s->set_bytes(rec.bytes());
    s->set_checksum_digest(storage::DigestHex(rec.checksum_digest()));
    s->set_node_id(rec.node_id());
    total += rec.bytes();
  }
  // The manifest is durable before the state says the step is good.
  absl::Status s = storage::WriteGlobalManifest(*shared_, m);
  if (!s.ok()) return s;
  job.rec.add_manifest_steps(step);
  if (!job.rec.has_last_good() || step > job.rec.last_good_step()) {
    job.rec.set_has_last_good(true);
    job.rec.set_last_good_step(step);
    // Shard records older than the last good step are no longer needed.
    for (auto st = job.steps.begin(); st != job.steps.end() && st->first < step;) {
      for (const auto& [rank, rec] : st->second) batch->DeleteShard(job.rec.job(), st->first, rank);
      st = job.steps.erase(st);
    }
  }
  batch->PutJob(job.rec);
  LogLocked(batch, v1::STEP_DURABLE, job.rec.job(), "",
            absl::StrCat("step ", step, ": ", total, " bytes on ", job.rec.world_size(),
                         " ranks; manifest ", storage::GlobalManifestKey(job.rec.job(), step)));
  return absl::OkStatus();
}

}  // namespace ckpt::coordinator
