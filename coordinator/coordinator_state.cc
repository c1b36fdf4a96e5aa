// Coordinator: the in-memory indexes and checks every call shares (nodes'
// liveness, ranks by node, shard records, orders, the event log, epoch and
// hosting checks), the read-only views (cluster, events, a launcher's job
// view) and the failure detector's tick.
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"

namespace ckpt::coordinator {

void Coordinator::SetLiveLocked(NodeState& node) {
  std::unique_lock<std::shared_mutex> live(live_mu_);
  std::unique_ptr<NodeLiveness>& l = live_[node.rec.node_id()];
  if (!l) l = std::make_unique<NodeLiveness>();
  l->epoch = node.rec.epoch();
  l->alive = node.rec.health() == v1::ALIVE;
  l->owed_since_ms = 0;  // an answer owed to an older epoch is not this one's
  node.live = l.get();
  replica_targets_.MarkStale();  // a node joined, died or came back
}

void Coordinator::IndexJobLocked(JobState& job) {
  job.ranks_by_node.clear();
  for (uint32_t r = 0; r < static_cast<uint32_t>(job.rec.rank_node_size()); ++r)
    job.ranks_by_node[job.rec.rank_node(r)].push_back(r);
  replica_targets_.MarkStale();  // which nodes host ranks may have changed
}

void Coordinator::PutShardLocked(JobState& job, v1::ShardRecord rec) {
  const uint64_t step = rec.step();
  auto& shards = job.steps[step];
  auto it = shards.find(rec.rank());
  bool was = it != shards.end() && it->second.state() == v1::DURABLE;
  bool now = rec.state() == v1::DURABLE;
  if (was != now) job.durable_ranks[step] += now ? 1 : -1;
  shards[rec.rank()] = std::move(rec);
}

void Coordinator::EraseStepLocked(JobState& job, uint64_t step) {
  job.steps.erase(step);
  job.durable_ranks.erase(step);
  job.replicas.erase(step);
  job.rank_indexes.erase(step);
}

void Coordinator::OrdersGoneLocked(const std::vector<v1::Order>& gone) {
  // A node done fetching may hold replicas again (see ReplicaTargetsLocked).
  for (const v1::Order& o : gone)
    if (o.kind() == v1::PREFETCH) replica_targets_.MarkStale();
}

void Coordinator::LogLocked(Batch* batch, v1::EventKind kind,
                            const std::string& job, const std::string& node,
                            const std::string& detail) {
  v1::Event e;
  e.set_job(job);
  e.set_node_id(node);
  e.set_kind(kind);
  e.set_detail(detail);
  LogLocked(batch, std::move(e));
}

void Coordinator::LogLocked(Batch* batch, v1::Event e) {
  e.set_seq(next_event_seq_++);
  e.set_time_ms(options_.now_ms());
  batch->PutEvent(e);
  events_.push_back(std::move(e));
  while (events_.size() > options_.max_events) {
    batch->DeleteEvent(events_.front().seq());
    events_.pop_front();
  }
}

absl::Status Coordinator::CheckEpochLocked(const std::string& node_id,
                                           uint64_t epoch) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end())
    return absl::NotFoundError(
        absl::StrCat("node_id: \"", node_id, "\" is not registered"));
  const v1::NodeRecord& n = it->second.rec;
  if (epoch != n.epoch() || n.health() != v1::ALIVE)
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch: ", epoch, " of node ", node_id, " is fenced (current epoch ",
        n.epoch(), ", ",
        n.health() == v1::ALIVE ? "alive" : "dead: " + n.dead_reason(),
        "); re-register"));
  return absl::OkStatus();
}

absl::StatusOr<JobState*> Coordinator::HostedRankLocked(
    const std::string& node_id, const std::string& job, uint32_t rank) {
  auto it = jobs_.find(job);
  if (it == jobs_.end())
    return absl::NotFoundError(
        absl::StrCat("job: \"", job, "\" is not registered"));
  if (rank >= it->second.rec.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " >= world_size ",
                     it->second.rec.world_size(), " of job ", job));
  const std::string& host = it->second.rec.rank_node(rank);
  if (host != node_id)
    return absl::FailedPreconditionError(
        absl::StrCat("rank: ", rank, " of job ", job, " is hosted by node ",
                     host, ", not ", node_id));
  return &it->second;
}

uint32_t Coordinator::HostedRanksLocked(const std::string& node_id) const {
  uint32_t n = 0;
  for (const auto& [name, job] : jobs_) {
    auto it = job.ranks_by_node.find(node_id);
    if (it != job.ranks_by_node.end())
      n += static_cast<uint32_t>(it->second.size());
  }
  return n;
}

void Coordinator::QueueOrderLocked(Batch* batch, v1::Order order) {
  order.set_id(counters_.next_order_id());
  counters_.set_next_order_id(order.id() + 1);
  batch->PutCounters(counters_);
  if (order.kind() == v1::PREFETCH) replica_targets_.MarkStale();
  orders_.Queue(batch, std::move(order));
}

v1::GetClusterResponse Coordinator::GetCluster() {
  absl::MutexLock lock(&mu_);
  v1::GetClusterResponse resp;
  const int64_t now = options_.now_ms();
  const auto& targets = ReplicaTargetsLocked();
  for (const auto& [id, n] : nodes_) {
    v1::NodeRecord* r = resp.add_nodes();
    *r = n.rec;
    r->set_ms_since_heartbeat(now - LastSeen(n));
    if (auto t = targets.find(id); t != targets.end())
      r->set_replica_target(t->second);
    r->set_ms_since_health_check(HealthAgeLocked(n));
  }
  for (const auto& [name, job] : jobs_) {
    *resp.add_jobs() = job.rec;
    *resp.add_memory() = JobMemoryLocked(job);
    for (uint32_t r : job.watch.stragglers) {
      v1::StragglerMark* m = resp.add_stragglers();
      m->set_job(name);
      m->set_rank(r);
      if (r < static_cast<uint32_t>(job.rec.rank_node_size()))
        m->set_node_id(job.rec.rank_node(r));
    }
  }
  size_t first = events_.size() > 50 ? events_.size() - 50 : 0;
  for (size_t i = first; i < events_.size(); ++i)
    *resp.add_recent_events() = events_[i];
  return resp;
}

v1::EventsResponse Coordinator::Events(const v1::EventsRequest& req) {
  absl::MutexLock lock(&mu_);
  v1::EventsResponse resp;
  for (const auto& e : events_)
    if (e.seq() > req.after_seq() &&
        (req.job().empty() || e.job() == req.job() || e.job().empty()))
      *resp.add_events() = e;
  return resp;
}

v1::NodeView Coordinator::NodeOrders(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  v1::NodeView v;
  for (uint64_t id : orders_.Deliverable(node_id)) v.add_order_ids(id);
  if (auto p = probes_.find(node_id); p != probes_.end())
    v.set_probe(p->second.id);  // a peer suspects it: heartbeat now
  return v;
}

v1::JobView Coordinator::View(const std::string& job_name,
                              const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  v1::JobView v;
  v.set_job(job_name);
  auto node = nodes_.find(node_id);
  if (node != nodes_.end()) {
    v.set_node_health(node->second.rec.health());
    v.set_node_epoch(node->second.rec.epoch());
  }
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) return v;
  const v1::JobRecord& j = it->second.durable_rec;
  if (j.job().empty()) return v;  // registered, not yet durable
  v.set_registered(true);
  v.set_world_size(j.world_size());
  v.set_generation(j.generation());
  v.set_plan_state(j.plan_state());
  v.set_has_last_good(j.has_last_good());
  v.set_last_good_step(j.last_good_step());
  v.set_has_restore_step(j.has_restore_step());
  v.set_restore_step(j.restore_step());
  v.set_trainers_may_start(TrainersMayStartLocked(it->second));
  v.set_finish_tracked(true);
  v.set_job_finished(it->second.clean_exit_gen == j.generation() + 1 &&
                     it->second.clean_exits.size() >= j.world_size());
  auto mine = it->second.durable_ranks_by_node.find(node_id);
  if (mine != it->second.durable_ranks_by_node.end())
    *v.mutable_ranks() = {mine->second.begin(), mine->second.end()};
  // A restore at another world size: the saved rank each of these ranks
  // restores (ckptrun's CKPT_RESTORE_RANK).
  if (j.restore_world_size() != 0 &&
      j.restore_ranks_size() == j.rank_node_size()) {
    v.set_restore_world_size(j.restore_world_size());
    for (uint32_t r : v.ranks()) v.add_restore_ranks(j.restore_ranks(r));
  }
  if (j.has_stack_request())
    for (const std::string& n : j.stack_request().nodes())
      if (n == node_id)
        v.set_capture_stacks_generation(j.stack_request().generation());
  if (j.rank_node_size() > 0) {
    auto r0 = nodes_.find(j.rank_node(0));
    if (r0 != nodes_.end()) v.set_rank0_address(r0->second.rec.address());
  }
  return v;
}

absl::Status Coordinator::Tick() {
  // Cheap without the state mutex while no node can have timed out.
  if (options_.now_ms() < next_expiry_ms_.load()) return absl::OkStatus();
  Txn txn(this);
  return txn.Commit();
}

}  // namespace ckpt::coordinator
