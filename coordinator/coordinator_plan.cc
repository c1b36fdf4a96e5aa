// Coordinator: failure detection, recovery plans, orders, and the global
// commit of a step (manifest first, then last good).
#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "coordinator/save_digest.h"
#include "storage/manifest.h"

namespace ckpt::coordinator {

void Coordinator::DetectTimeoutsLocked(Batch* batch) {
  const int64_t now = options_.now_ms();
  if (now < next_expiry_ms_.load()) return;  // no node can have timed out yet
  const int64_t timeout = options_.heartbeat_timeout.count();
  // Silence while the coordinator could not hear is no one's: a window
  // starts no earlier than hearing last recovered (hearing.h).
  const int64_t heard_since = hearing_.heard_since_ms();
  // Every node that timed out is dead before any plan is made, so that no
  // plan hands ranks to a node that is about to be declared dead too.
  std::vector<std::string> dead;
  std::map<std::string, std::string> why;
  std::vector<std::string> overdue;
  int64_t next = INT64_MAX;
  {
    // Exclusive: no heartbeat moves a last-seen time while we decide.
    std::unique_lock<std::shared_mutex> live(live_mu_);
    for (auto& [id, node] : nodes_) {
      if (node.rec.health() != v1::ALIVE) continue;
      if (!node.live->answered) {  // its registration is not durable yet
        next = std::min(next, now + timeout + 1);
        continue;
      }
      const int64_t last = WindowStart(*node.live, now, heard_since, timeout);
      if (now - last <= timeout) {
        next = std::min(next, last + timeout + 1);
        continue;
      }
      node.live->alive = false;
      dead.push_back(id);
      why[id] = absl::StrCat("no heartbeat for ", now - last, " ms");
    }
    // Probed nodes that did not answer in time die with them: one plan.
    if (!probes_.empty()) {
      std::vector<std::pair<std::string, std::string>> probed;
      ExpiredProbesLocked(now, &next, &probed, &overdue);
      for (auto& [id, reason] : probed) {
        dead.push_back(id);
        why[id] = std::move(reason);
      }
    }
    next_expiry_ms_ = next;
  }
  for (const std::string& id : overdue) {
    const Probe& p = probes_.at(id);
    LogLocked(batch, v1::PROBE_OVERDUE, "", id,
              absl::StrCat("node ", id, " did not answer the probe (", p.by,
                           " lost its trainers' peers there) within ",
                           options_.peer_probe_timeout.count(),
                           " ms, but its connection is open (its process "
                           "lives): not dead for that; it keeps its ranks "
                           "until it answers, its connection closes or its "
                           "heartbeat times out"));
  }
  for (const std::string& id : dead)
    DeclareDeadLocked(batch, nodes_[id], why[id]);
  for (auto& [name, job] : jobs_)
    for (const std::string& id : dead)
      if (job.ranks_by_node.count(id)) {
        MakePlanLocked(
            batch, job,
            absl::StrCat("node ", absl::StrJoin(dead, ","), " dead"));
        break;
      }
  DetectUnacknowledgedPlansLocked(batch, now);
  DetectSpareWaitsLocked(batch, now);
}

void Coordinator::LowerNextExpiryLocked(int64_t at) {
  int64_t cur = next_expiry_ms_.load();
  while (at < cur && !next_expiry_ms_.compare_exchange_weak(cur, at)) {
  }
}

void Coordinator::DetectUnacknowledgedPlansLocked(Batch* batch, int64_t now) {
  const int64_t limit = options_.plan_ack_timeout.count();
  if (limit <= 0) return;
  for (auto& [name, job] : jobs_) {
    if (job.rec.plan_state() != v1::PLAN_ORDERED) continue;
    const int64_t due = job.plan_ordered_ms + limit;
    if (now <= due) {
      LowerNextExpiryLocked(due + 1);
      continue;
    }
    // The nodes still holding an order of this plan (STOP orders go to
    // dead nodes and are not waited for).
    std::map<std::string, std::vector<std::string>> late;
    for (const auto& [id, o] : orders_.all())
      if (o.job() == name && o.kind() != v1::STOP)
        late[o.node_id()].push_back(
            absl::StrCat("order ", id, " ", v1::OrderKind_Name(o.kind())));
    std::vector<std::string> failed;
    for (const auto& [id, what] : late) {
      auto node = nodes_.find(id);
      if (node == nodes_.end() || node->second.rec.health() != v1::ALIVE)
        continue;
      // Failed for this plan: fenced like a dead node, so that a late
      // acknowledgement (or report) of the stuck epoch changes nothing; it
      // comes back by registering again.
      DeclareDeadLocked(
          batch, node->second,
          absl::StrCat("did not acknowledge ", absl::StrJoin(what, ", "),
                       " of job ", name, " generation ", job.rec.generation(),
                       " within ", limit, " ms"));
      options_.metrics->FailureDetected(metric::kPlanUnacknowledged);
      failed.push_back(id);
    }
    if (failed.empty()) {
      job.plan_ordered_ms = now;  // nothing left to fail: wait another period
      continue;
    }
    for (auto& [other, j] : jobs_)
      for (const std::string& id : failed)
        if (j.ranks_by_node.count(id)) {
          MakePlanLocked(batch, j,
                         absl::StrCat("node ", absl::StrJoin(failed, ","),
                                      " did not acknowledge the plan"));
          break;
        }
  }
}

void Coordinator::TrimStepsLocked(JobState& job) {
  if (job.steps.size() <= options_.max_soft_steps) return;
  std::vector<uint64_t> drop;
  size_t over = job.steps.size() - options_.max_soft_steps;
  for (const auto& [n, shards] : job.steps) {
    if (drop.size() == over) break;
    // The last good step's records say where its shards are in memory;
    // a step being committed is not dropped under its writer.
    if ((job.rec.has_last_good() && n <= job.rec.last_good_step()) ||
        job.committing.count(n))
      continue;
    drop.push_back(n);
  }
  for (uint64_t n : drop) EraseStepLocked(job, n);
  if (!drop.empty()) options_.metrics->StepsTrimmed(drop.size());
}

void Coordinator::DeclareDeadLocked(Batch* batch, NodeState& node,
                                    const std::string& reason) {
  const std::string id = node.rec.node_id();
  node.rec.set_health(v1::DEAD);
  ++net_nodes_version_;       // the network check's node set may have changed
  health_medians_.Changed();  // its report leaves the medians
  node.rec.set_dead_reason(reason);
  SetLiveLocked(node);
  batch->PutNode(node.rec);
  LogLocked(batch, v1::FAILURE_DETECTED, "", id,
            absl::StrCat("node ", id, " epoch ", node.rec.epoch(),
                         " declared dead: ", reason));
  options_.metrics->FailureDetected(metric::kNodeDead);
  DropReplicasHeldByLocked(id);
  OrdersGoneLocked(orders_.EraseOfNode(batch, id));
}

bool Coordinator::InHostMemoryLocked(const JobState& job, uint64_t step,
                                     uint32_t rank,
                                     const std::string* on) const {
  auto st = job.steps.find(step);
  if (st == job.steps.end()) return false;
  auto sh = st->second.find(rank);
  if (sh == st->second.end()) return false;
  if (!on && rank >= static_cast<uint32_t>(job.rec.rank_node_size()))
    return false;
  auto host = nodes_.find(on ? *on : job.rec.rank_node(rank));
  return host != nodes_.end() && host->second.rec.health() == v1::ALIVE &&
         sh->second.node_id() == host->first &&
         sh->second.epoch() == host->second.rec.epoch();
}

std::optional<uint64_t> Coordinator::RestoreStepLocked(
    const JobState& job) const {
  for (auto st = job.steps.rbegin(); st != job.steps.rend(); ++st) {
    // (The last good step may be of another world size: restored below.)
    bool every_rank =
        st->second.size() == job.rec.world_size() &&
        SavedWorldSizeLocked(job, st->first) == job.rec.world_size();
    for (uint32_t r = 0; every_rank && r < job.rec.world_size(); ++r)
      every_rank = SourceOfLocked(job, st->first, r).kind != CopySource::kNone;
    if (every_rank) return st->first;
  }
  // Shard records of the last good step may be gone (a rollback to an older
  // manifest); its manifest still names every shard.
  if (job.rec.has_last_good()) return job.rec.last_good_step();
  return std::nullopt;
}

void Coordinator::DropStepsAfterLocked(Batch*, JobState& job,
                                       std::optional<uint64_t> step) {
  std::vector<uint64_t> drop;
  for (const auto& [n, shards] : job.steps)
    if (!step || n > *step) drop.push_back(n);
  for (uint64_t n : drop)
    EraseStepLocked(job, n);  // soft state: nothing on disk
}

void Coordinator::DropOrdersOfJobLocked(Batch* batch, const std::string& job) {
  // STOP orders to dead nodes stay: they tell a returning node which ranks
  // it lost.
  OrdersGoneLocked(orders_.EraseIf(batch, [&](const v1::Order& o) {
    return o.job() == job && o.kind() != v1::STOP;
  }));
}

void Coordinator::MakePlanLocked(Batch* batch, JobState& job,
                                 const std::string& failure,
                                 const std::string& node_id) {
  const std::string& name = job.rec.job();
  // Held: only an operator plans again (Resume, Rollback).
  if (job.rec.plan_state() == v1::PLAN_HELD) return;
  // Every rank restarts: the exits that waited for a probe are covered.
  const std::string cause = absl::StrCat(failure, FoldHeldExitsLocked(job));
  // Every plan since the last commit failed: one more would most likely
  // fail the same way (a restore that cannot work, a bad build), forever.
  if (options_.max_failed_plans != 0 &&
      job.rec.plans_since_commit() >= options_.max_failed_plans) {
    HoldLocked(batch, job, cause, node_id);
    return;
  }
  options_.metrics->PlanMade(name, options_.now_ms());
  // When the failure this plan answers was last heard from: a dead host's
  // last heartbeat (the earliest), else now (a hang, a cordon, a
  // rollback). A plan that found no spare before answers the same failure.
  // A trainer started after it is of the new generation (its launcher
  // restarted it, maybe before this plan); one started before is not.
  int64_t failed = options_.now_ms();
  for (const std::string& host : job.rec.rank_node())
    if (auto n = nodes_.find(host); n != nodes_.end() && !n->second.live->alive)
      failed = std::min(failed, LastSeen(n->second));
  if (auto prev = job.failure_ms.find(job.rec.generation());
      job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE &&
      prev != job.failure_ms.end())
    failed = std::min(failed, prev->second);
  job.rec.set_generation(job.rec.generation() + 1);
  job.failure_ms[job.rec.generation()] = failed;
  while (job.failure_ms.size() > 8)
    job.failure_ms.erase(job.failure_ms.begin());
  DropOrdersOfJobLocked(batch, name);
  // Group the ranks of hosts that may not keep them (dead, cordoned,
  // unhealthy) by host; move each group to a spare. An unhealthy host that
  // is alive keeps its ranks when no spare can take them: a restart there
  // beats a job waiting on a bandwidth verdict.
  std::map<std::string, std::vector<uint32_t>> lost;
  std::set<std::string> may_stay;  // alive, not cordoned, unhealthy
  for (uint32_t r = 0; r < job.rec.world_size(); ++r) {
    auto host = nodes_.find(job.rec.rank_node(r));
    if (host != nodes_.end() && Placeable(host->second.rec)) continue;
    lost[job.rec.rank_node(r)].push_back(r);
    if (host != nodes_.end() && host->second.rec.health() == v1::ALIVE &&
        !host->second.rec.cordoned())
      may_stay.insert(host->first);
  }
  job.rec.clear_lost_ranks();
  std::vector<std::string> moves;
  for (const auto& [dead, ranks] : lost) {
    NodeState* spare = SpareForLocked(ranks.size());
    if (!spare && may_stay.count(dead)) continue;
    if (!spare) {
      job.rec.mutable_lost_ranks()->Add(ranks.begin(), ranks.end());
      continue;
    }
    for (uint32_t r : ranks) job.rec.set_rank_node(r, spare->rec.node_id());
    spare->rec.set_spare(false);
    batch->PutNode(spare->rec);
    moves.push_back(absl::StrCat("ranks ", absl::StrJoin(ranks, ","), " ", dead,
                                 "->", spare->rec.node_id()));
    v1::Order stop;
    stop.set_node_id(dead);
    stop.set_kind(v1::STOP);
    stop.set_job(name);
    stop.mutable_ranks()->Add(ranks.begin(), ranks.end());
    stop.set_generation(job.rec.generation());
    stop.set_world_size(job.rec.world_size());
    QueueOrderLocked(batch, std::move(stop));
  }
  // No spare for them: an elastic job goes on with fewer ranks.
  std::string resized;
  if (!job.rec.lost_ranks().empty() && ShrinkLocked(batch, job, &resized))
    moves.push_back(resized);
  IndexJobLocked(job);
  if (!job.rec.lost_ranks().empty()) {
    job.rec.set_plan_state(v1::PLAN_WAITING_FOR_NODE);
    PutJobLocked(batch, job);
    v1::Event e;
    e.set_kind(v1::PLAN_WAITING);
    e.set_job(name);
    e.set_world_size(job.rec.world_size());
    e.set_detail(
        absl::StrCat("generation ", job.rec.generation(), " (", cause,
                     "): ranks ", absl::StrJoin(job.rec.lost_ranks(), ","),
                     " have no host; waiting for a spare or their node",
                     UnhealthySparesLocked()));
    LogLocked(batch, std::move(e));
    return;
  }
  job.no_host_since_ms = 0;
  job.spare_wait_over = false;
  // Counted: the plans that restart trainers (one that waits for a node
  // restarts none, and is made again as nodes come).
  job.rec.set_plans_since_commit(job.rec.plans_since_commit() + 1);
  std::optional<uint64_t> step = RestoreStepLocked(job);
  // What the choice saved: against the newest step any rank reached and
  // the newest that storage alone restores (event RESTORE_SOURCES).
  const std::optional<uint64_t> durable = DurableStepLocked(job);
  std::optional<uint64_t> newest = durable;
  if (!job.steps.empty() && (!newest || job.steps.rbegin()->first > *newest))
    newest = job.steps.rbegin()->first;
  DropStepsAfterLocked(batch, job, step);
  std::optional<storage::v1::GlobalManifest> manifest;
  if (step && job.steps.count(*step) == 0) {
    // The last good step (RestoreStepLocked): its manifest is in memory, so
    // no plan waits on the shared root with the state mutex held.
    if (const storage::v1::GlobalManifest* m =
            KnownManifestLocked(name, *step)) {
      manifest = *m;
    } else {
      LogLocked(batch, v1::MANIFEST_INVALID, name, "",
                absl::StrCat("step ", *step,
                             ": its manifest is not in memory; PREFETCH orders "
                             "name no shard"));
    }
  }
  const std::string remap = RemapRestoreLocked(
      job, step,
      step ? SavedWorldSizeLocked(job, *step) : job.rec.world_size());
  v1::Event made;
  made.set_kind(v1::PLAN_MADE);
  made.set_job(name);
  made.set_world_size(job.rec.world_size());
  made.set_detail(absl::StrCat(
      "generation ", job.rec.generation(), " (", cause, "): world size ",
      job.rec.world_size(), ", restore ",
      step ? absl::StrCat("step ", *step) : std::string("from scratch"),
      remap.empty()
          ? std::string()
          : absl::StrCat(" saved at world size ", job.rec.restore_world_size(),
                         " (rank<-saved rank ", remap, ")"),
      moves.empty() ? "" : "; ", absl::StrJoin(moves, "; ")));
  LogLocked(batch, std::move(made));
  std::vector<v1::RankSource> fetched;
  IssueOrdersLocked(batch, job, step, manifest ? &*manifest : nullptr,
                    &fetched);
  LogRestoreSourcesLocked(batch, job, step, newest, durable,
                          std::move(fetched));
}

void Coordinator::HoldLocked(Batch* batch, JobState& job,
                             const std::string& cause,
                             const std::string& node_id) {
  const std::string& name = job.rec.job();
  const std::optional<uint64_t> step = RestoreStepLocked(job);
  // The failed plan's trainers stop as any plan's do: a new generation
  // (each launcher stops the trainers of the one it runs), whose plan
  // state lets none start (JobView), and the failed plan's orders gone.
  job.rec.set_generation(job.rec.generation() + 1);
  job.failure_ms[job.rec.generation()] = options_.now_ms();
  while (job.failure_ms.size() > 8)
    job.failure_ms.erase(job.failure_ms.begin());
  DropOrdersOfJobLocked(batch, name);
  job.rec.set_plan_state(v1::PLAN_HELD);
  job.rec.set_held_reason(absl::StrCat(
      "held in generation ", job.rec.generation(), ": ",
      job.rec.plans_since_commit(), " plans without a commit (",
      job.rec.has_last_good()
          ? absl::StrCat("last good step ", job.rec.last_good_step())
          : std::string("no step committed"),
      "; --max-failed-plans ", options_.max_failed_plans,
      ") and the last failed too: ", cause,
      node_id.empty() ? "" : absl::StrCat(" on node ", node_id),
      "; a plan would restore ",
      step ? absl::StrCat("step ", *step) : std::string("from scratch"),
      "; its trainers are stopped. Fix the cause, then: ckptctl resume --job ",
      name, " (or ckptctl rollback)"));
  PutJobLocked(batch, job);
  v1::Event e;
  e.set_kind(v1::JOB_HELD);
  e.set_job(name);
  e.set_node_id(node_id);
  e.set_world_size(job.rec.world_size());
  e.set_detail(job.rec.held_reason());
  LogLocked(batch, std::move(e));
}

void Coordinator::IssueOrdersLocked(Batch* batch, JobState& job,
                                    std::optional<uint64_t> step,
                                    const storage::v1::GlobalManifest* manifest,
                                    std::vector<v1::RankSource>* fetched) {
  const std::string& name = job.rec.job();
  for (const auto& [host, ranks] : job.ranks_by_node) {
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
      // Fetched shards are of the world size they were saved at.
      if (job.rec.restore_world_size() != 0)
        prefetch.set_world_size(job.rec.restore_world_size());
      if (job.rec.has_owner_uid()) prefetch.set_owner_uid(job.rec.owner_uid());
      // A restore at another world size fetches the saved rank each rank
      // restores (restore_ranks).
      std::set<uint32_t> named;  // ranks of one host may share a saved rank
      for (uint32_t rank : ranks) {
        const uint32_t r = SavedRankOf(job.rec, rank);
        if (!named.insert(r).second) continue;
        const CopySource source = SourceOfLocked(job, *step, r, &host);
        if (source.kind == CopySource::kHostMemory) continue;
        // A peer's copy first (then a second holder's); the key (when
        // durable) is the fallback.
        *prefetch.add_sources() = PrefetchSourceLocked(job, *step, r, source);
        if (fetched) {
          v1::RankSource& f = fetched->emplace_back();
          f.set_rank(r);
          f.set_copy(CopyName(source.kind));
          if (source.node) f.set_node_id(source.node->node_id());
        }
        std::string key;
        auto st = job.steps.find(*step);
        if (st != job.steps.end() && st->second.count(r) &&
            st->second.at(r).state() == v1::DURABLE)
          key = st->second.at(r).key();
        if (key.empty() && manifest)
          for (const auto& s : manifest->shards())
            if (s.rank() == r) key = s.key();
        prefetch.add_ranks(r);
        prefetch.add_shard_keys(key);
      }
      if (!prefetch.ranks().empty())
        QueueOrderLocked(batch, std::move(prefetch));
    }
    v1::Order restart = base;
    restart.set_kind(v1::RESTART);
    restart.mutable_ranks()->Add(ranks.begin(), ranks.end());
    QueueOrderLocked(batch, std::move(restart));
  }
  job.rec.set_plan_state(v1::PLAN_ORDERED);
  job.plan_ordered_ms = options_.now_ms();
  LowerNextExpiryLocked(job.plan_ordered_ms +
                        options_.plan_ack_timeout.count() + 1);
  job.rec.set_has_restore_step(step.has_value());
  job.rec.set_restore_step(step.value_or(0));
  PutJobLocked(batch, job);
}

void Coordinator::UpdatePlanProgressLocked(Batch* batch, JobState& job) {
  if (job.rec.plan_state() != v1::PLAN_ORDERED) return;
  for (const auto& [id, o] : orders_.all())
    if (o.job() == job.rec.job() && o.kind() != v1::STOP) return;
  job.rec.set_plan_state(v1::PLAN_ACKNOWLEDGED);
  PutJobLocked(batch, job);
  LogLocked(batch, v1::PLAN_ACKED, job.rec.job(), "",
            absl::StrCat("generation ", job.rec.generation(),
                         ": every order acknowledged"));
  options_.metrics->PlanAcknowledged(job.rec.job(), options_.now_ms());
}

bool Coordinator::StepCompleteLocked(JobState& job, uint64_t step,
                                     std::vector<PendingCommit>* out) {
  auto count = job.durable_ranks.find(step);
  if (count == job.durable_ranks.end() || count->second != job.rec.world_size())
    return false;
  const auto& done = job.rec.manifest_steps();
  if (std::find(done.begin(), done.end(), step) != done.end()) return true;
  if (!job.committing.insert(step).second)
    return true;  // another call writes its manifest
  PendingCommit c;
  c.job = job.rec.job();
  c.step = step;
  c.generation = job.rec.generation();
  c.saved_generation = c.generation;
  storage::v1::GlobalManifest& m = c.manifest;
  m.set_format(storage::kGlobalManifestFormat);
  m.set_job(job.rec.job());
  m.set_step(step);
  m.set_world_size(job.rec.world_size());
  m.set_generation(job.rec.generation());
  m.set_fence(options_.fence);
  for (const auto& [rank, rec] : job.steps[step]) {
    storage::v1::ManifestShard* s = m.add_shards();
    s->set_rank(rank);
    s->set_key(rec.key());
    s->set_bytes(rec.bytes());
    s->set_checksum_digest(storage::DigestHex(rec.checksum_digest()));
    s->set_node_id(rec.node_id());
    if (rec.has_generation())
      c.saved_generation = std::min(c.saved_generation, rec.generation());
  }
  // Merged when every rank sent its pieces (the manifest lists them all).
  if (auto idx = job.rank_indexes.find(step);
      idx != job.rank_indexes.end() &&
      idx->second.size() == static_cast<size_t>(m.shards_size())) {
    for (const auto& s : m.shards()) {
      auto blob = idx->second.find(s.rank());
      if (blob == idx->second.end()) {
        c.rank_indexes.clear();
        break;
      }
      c.rank_indexes.push_back(blob->second);
    }
  }
  out->push_back(std::move(c));
  return true;
}

bool Coordinator::FinishStepLocked(Batch* batch, const PendingCommit& c) {
  JobState& job = jobs_[c.job];
  const auto& done = job.rec.manifest_steps();
  if (std::find(done.begin(), done.end(), c.step) != done.end()) return true;
  // A plan made while the manifest was written may have taken the step out
  // of the timeline (a rollback or a restore of an older step dropped its
  // records; a newer step committed meanwhile did too). When its records
  // are still the durable shards the manifest names (the plan restores
  // this step or a later one), it is committed, as its reports were told.
  auto st = job.steps.find(c.step);
  if (st == job.steps.end() ||
      st->second.size() != static_cast<size_t>(c.manifest.shards_size()))
    return false;
  for (const auto& s : c.manifest.shards()) {
    auto rec = st->second.find(s.rank());
    if (rec == st->second.end() || rec->second.state() != v1::DURABLE ||
        rec->second.node_id() != s.node_id() || rec->second.key() != s.key() ||
        storage::DigestHex(rec->second.checksum_digest()) !=
            s.checksum_digest())
      return false;
  }
  uint64_t total = 0;
  for (const auto& s : c.manifest.shards()) total += s.bytes();
  // The manifest is durable before the state says the step is good.
  options_.metrics->StepCommitted(
      job.rec.job(), c.step,
      !job.rec.has_last_good() || c.step > job.rec.last_good_step(),
      options_.now_ms());
  job.rec.add_manifest_steps(c.step);
  // The commit refers to this write of the manifest, not to whatever the
  // key holds later (a deposed leader's late write): readers check.
  v1::ManifestStamp& stamp = (*job.rec.mutable_manifest_stamps())[c.step];
  stamp.set_generation(c.manifest.generation());
  stamp.set_fence(c.manifest.fence());
  stamp.set_content_digest(c.content_digest);
  if (!job.rec.has_last_good() || c.step > job.rec.last_good_step()) {
    // The job moves: the plans made before the step was saved worked. One
    // made since (a save that turned durable late, a manifest still being
    // written) has shown nothing yet.
    const uint64_t after = job.rec.generation() > c.saved_generation
                               ? job.rec.generation() - c.saved_generation
                               : 0;
    job.rec.set_plans_since_commit(static_cast<uint32_t>(
        std::min<uint64_t>(job.rec.plans_since_commit(), after)));
    RememberManifestLocked(batch, c.manifest);
    job.rec.set_has_last_good(true);
    job.rec.set_last_good_step(c.step);
    job.rec.set_last_good_world_size(c.manifest.world_size());
    // Shard records older than the last good step are no longer needed.
    std::vector<uint64_t> old;
    for (const auto& [n, shards] : job.steps)
      if (n < c.step) old.push_back(n);
    for (uint64_t n : old) EraseStepLocked(job, n);
  }
  const bool newest =
      job.rec.has_last_good() && job.rec.last_good_step() == c.step;
  PutJobLocked(batch, job);
  LogLocked(batch, v1::STEP_DURABLE, job.rec.job(), "",
            absl::StrCat("step ", c.step, ": ", total, " bytes on ",
                         c.manifest.world_size(), " ranks; manifest ",
                         storage::GlobalManifestKey(job.rec.job(), c.step)));
  // A shrunk job grows back at its next checkpoint, from it.
  if (newest) GrowLocked(batch, job);
  return true;
}

}  // namespace ckpt::coordinator
