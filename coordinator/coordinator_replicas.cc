// Coordinator: peer replicas — where each node sends its ranks'
// replicas (replica_placement.h), the REPLICATED reports of their holders
// (soft state, like STAGED), and where a plan restores each rank from.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "coordinator/replica_placement.h"
#include "coordinator/save_digest.h"
#include "storage/manifest.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

// A node's epoch while it is alive, else 0 (ReplicaRefusals::EpochOf).
template <typename Nodes>
ReplicaRefusals::EpochOf AliveEpochs(const Nodes& nodes) {
  return [&nodes](const std::string& id) {
    auto n = nodes.find(id);
    return n != nodes.end() && n->second.rec.health() == v1::ALIVE
               ? n->second.rec.epoch()
               : uint64_t{0};
  };
}

}  // namespace

absl::Status Coordinator::ApplyReplicaReportLocked(const std::string& node_id,
                                                   uint64_t epoch,
                                                   const v1::ShardReport& req,
                                                   Batch*) {
  auto it = jobs_.find(req.job());
  if (it == jobs_.end())
    return absl::NotFoundError(
        absl::StrCat("job: \"", req.job(), "\" is not registered"));
  JobState& job = it->second;
  if (req.rank() >= job.rec.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", req.rank(), " >= world_size ",
                     job.rec.world_size(), " of job ", req.job()));
  if (req.source_node() == node_id)
    return absl::InvalidArgumentError(
        absl::StrCat("source_node: ", node_id,
                     " is the reporting node; a node holds no replica of "
                     "its own rank"));
  if (req.failed()) {
    // The holder dropped this copy (replaced, or given up for room): it
    // no longer counts, whatever step or generation it was of. Removing
    // the holder's own record is always safe, so nothing else is checked.
    auto st = job.replicas.find(req.step());
    if (st != job.replicas.end()) {
      auto rk = st->second.find(req.rank());
      if (rk != st->second.end()) {
        rk->second.erase(node_id);
        if (rk->second.empty()) st->second.erase(rk);
      }
      if (st->second.empty()) job.replicas.erase(st);
    }
    return absl::OkStatus();
  }
  // An older generation's save is of an abandoned timeline, unless it is
  // at or before the step the plans restored (a replacement replicating
  // the shard it restored: the STAGED save it is checked against below).
  if (req.has_generation() && req.generation() < job.rec.generation() &&
      !(job.rec.has_restore_step() && req.step() <= job.rec.restore_step()))
    return absl::FailedPreconditionError(absl::StrCat(
        "generation: ", req.generation(), " of the replica of step ",
        req.step(), " rank ", req.rank(), " of job ", req.job(),
        " is older than the job's generation ", job.rec.generation(),
        " (a timeline a plan abandoned); dropped"));
  if (job.rec.has_last_good() && req.step() < job.rec.last_good_step())
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " of job ", req.job(),
        " is older than the last good step ", job.rec.last_good_step()));
  const v1::ShardRecord* saved = nullptr;
  if (auto st = job.steps.find(req.step()); st != job.steps.end())
    if (auto rk = st->second.find(req.rank()); rk != st->second.end())
      saved = &rk->second;
  if (!saved) {
    // After a restart of the coordinator holders and sources send their
    // reports again in no order across nodes: while the source lives, its
    // STAGED report may still come (retry); else it never will.
    auto src = nodes_.find(req.source_node());
    if (src != nodes_.end() && src->second.rec.health() == v1::ALIVE)
      return absl::UnavailableError(absl::StrCat(
          "step: ", req.step(), " rank ", req.rank(), " of job ", req.job(),
          " has no STAGED report from ", req.source_node(),
          " yet; the replica counts once it has"));
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " rank ", req.rank(), " of job ", req.job(),
        " has no STAGED report, and source_node ", req.source_node(),
        " is not alive to send one; the replica does not count"));
  }
  if (req.source_node() != saved->node_id() &&
      req.source_node() != job.rec.rank_node(req.rank()))
    return absl::FailedPreconditionError(
        absl::StrCat("source_node: ", req.source_node(), " did not host rank ",
                     req.rank(), " of job ", req.job(), " (step ", req.step(),
                     " was staged by ", saved->node_id(), ")"));
  if (req.bytes() != saved->bytes())
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes: ", req.bytes(), " of the replica of step ", req.step(),
        " rank ", req.rank(), " differ from the staged ", saved->bytes()));
  // The copy names its save by the STAGED digest, or carries the digest
  // of the bytes it holds: the staged one, or (device tensors, once
  // durable) the durable one.
  const bool same_save = (req.has_staged_digest() &&
                          req.staged_digest() == StagedDigest(*saved)) ||
                         req.checksum_digest() == StagedDigest(*saved) ||
                         req.checksum_digest() == saved->checksum_digest();
  if (!same_save)
    return absl::InvalidArgumentError(absl::StrCat(
        "checksum_digest: ", storage::DigestHex(req.checksum_digest()),
        " of the replica of step ", req.step(), " rank ", req.rank(),
        " is not the staged save's ",
        storage::DigestHex(StagedDigest(*saved))));
  v1::ShardRecord rec;
  rec.set_job(req.job());
  rec.set_step(req.step());
  rec.set_rank(req.rank());
  rec.set_node_id(node_id);
  rec.set_epoch(epoch);
  rec.set_state(v1::REPLICATED);
  rec.set_bytes(req.bytes());
  rec.set_checksum_digest(StagedDigest(*saved));
  job.replicas[req.step()][req.rank()][node_id] = std::move(rec);
  // The holder keeps the two newest replicated steps of each rank
  // (replica_store.h): its copies of this rank older than those are gone.
  bool previous_kept = false;
  for (auto st = std::make_reverse_iterator(job.replicas.find(req.step()));
       st != job.replicas.rend();) {
    auto rk = st->second.find(req.rank());
    if (rk == st->second.end() || rk->second.count(node_id) == 0) {
      ++st;
      continue;
    }
    if (!previous_kept) {
      previous_kept = true;
      ++st;
      continue;
    }
    rk->second.erase(node_id);
    if (rk->second.empty()) st->second.erase(rk);
    if (st->second.empty())
      st = std::make_reverse_iterator(job.replicas.erase(std::next(st).base()));
    else
      ++st;
  }
  return absl::OkStatus();
}

void Coordinator::DropReplicasHeldByLocked(const std::string& holder) {
  for (auto& [name, job] : jobs_)
    for (auto& [step, ranks] : job.replicas)
      for (auto& [rank, holders] : ranks) holders.erase(holder);
}

CopySource Coordinator::SourceOfLocked(const JobState& job, uint64_t step,
                                       uint32_t rank,
                                       const std::string* host) const {
  CopySource out;
  auto st = job.steps.find(step);
  if (st == job.steps.end()) return out;
  auto sh = st->second.find(rank);
  if (sh == st->second.end()) return out;
  const v1::ShardRecord& saved = sh->second;
  if (InHostMemoryLocked(job, step, rank, host)) {
    out.kind = CopySource::kHostMemory;
    return out;
  }
  // A live node that serves copies: alive at the epoch it reported in.
  auto serving = [&](const std::string& id, uint64_t epoch)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                       return ServingLocked(id, epoch);
                     };
  // The node that saved it lives (its ranks moved: cordoned, unhealthy).
  if (const v1::NodeRecord* n = serving(saved.node_id(), saved.epoch())) {
    out.kind = CopySource::kOwnSlot;
    out.node = n;
    return out;
  }
  auto reps = job.replicas.find(step);
  if (reps != job.replicas.end()) {
    auto holders = reps->second.find(rank);
    if (holders != reps->second.end()) {
      // The rank's new host first (it fetches from itself), then by id.
      const std::string& to =
          host ? *host
          : rank < static_cast<uint32_t>(job.rec.rank_node_size())
              ? job.rec.rank_node(rank)
              : std::string();
      const v1::NodeRecord* best = nullptr;
      for (const auto& [id, rec] : holders->second) {
        const v1::NodeRecord* n = serving(id, rec.epoch());
        if (!n || rec.checksum_digest() != StagedDigest(saved)) continue;
        if (!best || id == to) best = n;
        if (id == to) break;
      }
      if (best) {
        out.kind = CopySource::kReplica;
        out.node = best;
        return out;
      }
    }
  }
  if (saved.state() == v1::DURABLE) out.kind = CopySource::kStorage;
  return out;
}

const v1::NodeRecord* Coordinator::ServingLocked(const std::string& id,
                                                 uint64_t epoch) const {
  auto n = nodes_.find(id);
  if (n == nodes_.end() || n->second.rec.health() != v1::ALIVE ||
      n->second.rec.epoch() != epoch || n->second.rec.replica_port() == 0 ||
      n->second.rec.address().empty())
    return nullptr;
  return &n->second.rec;
}

v1::ShardSource Coordinator::PrefetchSourceLocked(
    const JobState& job, uint64_t step, uint32_t rank,
    const CopySource& first) const {
  v1::ShardSource from = ShardSourceOf(first);
  if (from.host().empty()) return from;
  // The save this plan chose: a fetch refuses any other.
  const v1::ShardRecord& saved = job.steps.at(step).at(rank);
  auto name_the_save = [&](v1::ShardSource* s) {
    s->add_save_digests(StagedDigest(saved));
    if (saved.checksum_digest() != StagedDigest(saved))
      s->add_save_digests(saved.checksum_digest());
  };
  name_the_save(&from);
  // A second holder: the first may have dropped its copy (for room, or
  // replaced) with its withdrawal still on the way, or lost it with a
  // restart. Another failure domain than the first's is preferred: what
  // took the first (a rack's switch, its power) is less likely to have
  // taken it too.
  auto reps = job.replicas.find(step);
  if (reps == job.replicas.end()) return from;
  auto holders = reps->second.find(rank);
  if (holders == reps->second.end()) return from;
  auto elsewhere = [&](const v1::NodeRecord* n) {
    return !n->domain().empty() && n->domain() != first.node->domain();
  };
  const v1::NodeRecord* second = nullptr;
  for (const auto& [id, rec] : holders->second) {
    if (id == first.node->node_id() ||
        rec.checksum_digest() != StagedDigest(saved))
      continue;
    const v1::NodeRecord* n = ServingLocked(id, rec.epoch());
    if (n && (!second || (elsewhere(n) && !elsewhere(second)))) second = n;
  }
  if (second) {
    v1::ShardSource* s = from.mutable_second();
    *s = ShardSourceOf({CopySource::kReplica, second});
    name_the_save(s);
  }
  return from;
}

std::optional<uint64_t> Coordinator::MemoryStepLocked(
    const JobState& job) const {
  for (auto st = job.steps.rbegin(); st != job.steps.rend(); ++st) {
    bool every_rank = st->second.size() == job.rec.world_size();
    for (uint32_t r = 0; every_rank && r < job.rec.world_size(); ++r) {
      CopySource::Kind k = SourceOfLocked(job, st->first, r).kind;
      every_rank = k != CopySource::kNone && k != CopySource::kStorage;
    }
    if (every_rank) return st->first;
  }
  return std::nullopt;
}

std::optional<uint64_t> Coordinator::DurableStepLocked(
    const JobState& job) const {
  for (auto st = job.durable_ranks.rbegin(); st != job.durable_ranks.rend();
       ++st)
    if (st->second == job.rec.world_size()) return st->first;
  if (job.rec.has_last_good()) return job.rec.last_good_step();
  return std::nullopt;
}

std::vector<PlacementNode> Coordinator::ReplicaCandidatesLocked() const {
  std::vector<PlacementNode> in;
  for (const auto& [id, n] : nodes_) {
    if (n.rec.health() != v1::ALIVE) continue;
    PlacementNode p;
    p.id = id;
    p.domain = n.rec.domain();
    p.source = !n.rec.cordoned() && HostedRanksLocked(id) > 0;
    // A node fetching a plan's shards (a PREFETCH not yet acknowledged)
    // holds no replicas until it is done: survivors' copies to it would
    // share its link (and the sources' uplinks) with the recovery's fetch.
    p.holder = Placeable(n.rec) && n.rec.replica_port() != 0 &&
               !n.rec.address().empty() && !orders_.Has(id, v1::PREFETCH);
    if (p.source || p.holder) in.push_back(std::move(p));
  }
  return in;
}

const std::map<std::string, std::string>& Coordinator::ReplicaTargetsLocked() {
  return replica_targets_.Current(
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return ReplicaCandidatesLocked();
      },
      AliveEpochs(nodes_), options_.now_ms());
}

void Coordinator::ReplicaTargetForLocked(Batch* batch,
                                         const v1::HeartbeatRequest& req,
                                         v1::HeartbeatResponse* resp) {
  const std::string& node_id = req.node_id();
  if (req.has_replica_refused()) {
    const v1::ReplicaRefusal& r = req.replica_refused();
    if (replica_targets_.Refused(
            node_id, r.holder_node_id(),
            [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
              return ReplicaCandidatesLocked();
            },
            AliveEpochs(nodes_), options_.now_ms())) {
      auto next = ReplicaTargetsLocked().find(node_id);
      const std::string to =
          next == ReplicaTargetsLocked().end() ? "none" : next->second;
      LogLocked(
          batch, v1::REPLICA_REFUSED, "", node_id,
          absl::StrCat("node ", node_id, "'s replicas: ", r.holder_node_id(),
                       " refused them (",
                       r.reason().empty() ? "no reason given" : r.reason(),
                       "); target now ", to));
    }
  }
  const auto& targets = ReplicaTargetsLocked();
  auto t = targets.find(node_id);
  if (t == targets.end()) return;
  const v1::NodeRecord& holder = nodes_.at(t->second).rec;
  v1::ReplicaTarget* out = resp->mutable_replica_target();
  out->set_node_id(holder.node_id());
  out->set_host(HostOf(holder.address()));
  out->set_port(holder.replica_port());
}

v1::JobMemory Coordinator::JobMemoryLocked(const JobState& job) const {
  v1::JobMemory m;
  m.set_job(job.rec.job());
  if (std::optional<uint64_t> step = MemoryStepLocked(job)) {
    m.set_has_memory_step(true);
    m.set_memory_step(*step);
  }
  std::set<uint32_t> replicated;
  for (const auto& [step, ranks] : job.replicas) {
    uint32_t whole = 0;  // ranks of this step with a live copy
    for (const auto& [rank, holders] : ranks)
      for (const auto& [id, rec] : holders) {
        auto n = nodes_.find(id);
        if (n != nodes_.end() && n->second.rec.health() == v1::ALIVE &&
            n->second.rec.epoch() == rec.epoch()) {
          replicated.insert(rank);
          ++whole;
          break;
        }
      }
    if (whole == job.rec.world_size()) {  // steps ascend: the newest wins
      m.set_has_replicated_step(true);
      m.set_replicated_step(step);
    }
  }
  m.set_replicated_ranks(static_cast<uint32_t>(replicated.size()));
  return m;
}

void Coordinator::LogRestoreSourcesLocked(Batch* batch, const JobState& job,
                                          std::optional<uint64_t> step,
                                          std::optional<uint64_t> newest,
                                          std::optional<uint64_t> durable,
                                          std::vector<v1::RankSource> fetched) {
  v1::Event e;
  e.set_kind(v1::RESTORE_SOURCES);
  e.set_job(job.rec.job());
  v1::RestoreSources& rs = *e.mutable_restore();
  rs.set_generation(job.rec.generation());
  rs.set_has_step(step.has_value());
  rs.set_step(step.value_or(0));
  rs.set_has_newest_step(newest.has_value());
  rs.set_newest_step(newest.value_or(0));
  rs.set_has_durable_step(durable.has_value());
  rs.set_durable_step(durable.value_or(0));
  // Steps lost against `from`: none restores from scratch (all of them).
  const uint64_t top = newest.value_or(0);
  auto lost = [top](std::optional<uint64_t> from) -> uint64_t {
    return !from ? top : top > *from ? top - *from : 0;
  };
  rs.set_steps_lost(lost(step));
  rs.set_steps_lost_durable(lost(durable));
  std::vector<std::string> where;
  for (v1::RankSource& s : fetched) {
    rs.set_from_memory(rs.from_memory() || s.copy() != "storage");
    options_.metrics->RestoreSourced(job.rec.job(), s.copy());
    where.push_back(absl::StrCat(
        "rank ", s.rank(), " from ", s.copy(),
        s.node_id().empty() ? "" : absl::StrCat(" on ", s.node_id())));
    *rs.add_ranks() = std::move(s);
  }
  e.set_detail(absl::StrCat(
      "generation ", job.rec.generation(), ": restore ",
      step ? absl::StrCat("step ", *step) : std::string("from scratch"), " (",
      rs.steps_lost(), " steps lost; storage alone: ",
      durable ? absl::StrCat("step ", *durable) : std::string("none"), ", ",
      rs.steps_lost_durable(), " lost)", where.empty() ? "" : "; ",
      absl::StrJoin(where, "; ")));
  LogLocked(batch, std::move(e));
}

bool Coordinator::TrainersMayStartLocked(const JobState& job) const {
  if (!options_.start_trainers_with_prefetch ||
      job.durable_rec.plan_state() != v1::PLAN_ORDERED ||
      job.durable_rec.generation() != job.rec.generation())
    return false;
  for (const auto& [id, o] : orders_.all())
    if (o.job() == job.rec.job() && o.kind() == v1::RESTART) return false;
  return true;
}

absl::StatusOr<v1::ShardSourcesResponse> Coordinator::ShardSources(
    const v1::ShardSourcesRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  if (req.ranks_size() > kMaxSourceRanks)
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: ", req.ranks_size(), " ranks, at most ", kMaxSourceRanks));
  absl::MutexLock lock(&mu_);
  CKPT_RETURN_IF_ERROR(CheckEpochLocked(req.node_id(), req.epoch()));
  auto job = jobs_.find(req.job());
  if (job == jobs_.end())
    return absl::NotFoundError(
        absl::StrCat("job: unknown job '", req.job(), "'"));
  const JobState& j = job->second;
  auto step = j.steps.find(req.step());
  if (step == j.steps.end())
    return absl::NotFoundError(absl::StrCat(
        "step: job '", req.job(), "' has no shard of step ", req.step()));
  const uint32_t world_size = SavedWorldSizeLocked(j, req.step());
  v1::ShardSourcesResponse resp;
  resp.set_world_size(world_size);
  if (j.rec.has_owner_uid()) resp.set_owner_uid(j.rec.owner_uid());
  for (int i = 0; i < req.ranks_size(); ++i) {
    const uint32_t rank = req.ranks(i);
    if (rank >= world_size)
      return absl::InvalidArgumentError(
          absl::StrCat("ranks[", i, "]: ", rank, " is not below world_size ",
                       world_size, " of step ", req.step()));
    v1::RankShardSource* out = resp.add_ranks();
    out->set_rank(rank);
    auto saved = step->second.find(rank);
    if (saved == step->second.end()) continue;
    if (saved->second.state() == v1::DURABLE) out->set_key(saved->second.key());
    const CopySource first =
        SourceOfLocked(j, req.step(), rank, &req.node_id());
    if (first.kind == CopySource::kOwnSlot ||
        first.kind == CopySource::kReplica)
      *out->mutable_source() = PrefetchSourceLocked(j, req.step(), rank, first);
  }
  return resp;
}

}  // namespace ckpt::coordinator
