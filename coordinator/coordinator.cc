// Coordinator: the RPC-shaped entry points. Each validates its request,
// changes memory and a batch together, and commits the batch.
#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/assignments.h"
#include "coordinator/health_state.h"
#include "coordinator/heartbeat_interval.h"
#include "storage/manifest.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

constexpr uint32_t kMaxCapacity = 1 << 16;
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kMaxDomainBytes = 128;

// Checked before any state is touched: a refused request changes nothing.
[[nodiscard]] absl::Status ValidateNodeAndJob(const std::string& node_id,
                                              const std::string& job) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(node_id));
  return ValidateJobName(job, "job");
}

}  // namespace

absl::StatusOr<v1::RegisterNodeResponse> Coordinator::RegisterNode(
    const v1::RegisterNodeRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  if (req.capacity() == 0 || req.capacity() > kMaxCapacity)
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity: ", req.capacity(), " not in [1, ", kMaxCapacity, "]"));
  CKPT_RETURN_IF_ERROR(ValidatePrintable(
      req.address(), "address", kMaxAddressBytes, /*allow_empty=*/true));
  CKPT_RETURN_IF_ERROR(
      ValidateHealthReport(req.health_report(), "health_report"));
  if (req.net_probe_port() > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "net_probe_port: ", req.net_probe_port(), " not in [0, 65535]"));
  CKPT_RETURN_IF_ERROR(ValidatePrintable(
      req.domain(), "domain", kMaxDomainBytes, /*allow_empty=*/true));
  if (req.replica_port() > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "replica_port: ", req.replica_port(), " not in [0, 65535]"));
  Txn txn(this);
  Batch& batch = *txn.batch();
  auto existing = nodes_.find(req.node_id());
  if (existing != nodes_.end() && existing->second.rec.health() == v1::ALIVE) {
    if (req.previous_epoch() == 0 ||
        req.previous_epoch() != existing->second.rec.epoch())
      return txn.Commit(absl::AlreadyExistsError(absl::StrCat(
          "node_id: \"", req.node_id(), "\" is registered and alive at epoch ",
          existing->second.rec.epoch(),
          "; retry after its heartbeat times out (previous_epoch: ",
          req.previous_epoch(), " does not name it)")));
    // The node's ckptd restarted (a crash, an upgrade) within the
    // heartbeat timeout: it names the epoch only its previous life was
    // given. That life ends here without a failure: the node keeps its
    // ranks, so no plan restarts the job, and the shards it recovered are
    // reported again under the new epoch (the old one is fenced). Only
    // the replicas it held are gone with the old process's memory.
    DropReplicasHeldByLocked(req.node_id());
    LogLocked(
        &batch, v1::NODE_REGISTERED, "", req.node_id(),
        absl::StrCat("ckptd restarted: epoch ", existing->second.rec.epoch(),
                     " ends without a failure"));
  }
  NodeState& node = nodes_[req.node_id()];
  node.rec.set_node_id(req.node_id());
  node.rec.set_address(req.address());
  node.rec.set_capacity(req.capacity());
  // A node that still holds ranks (its plan waits for it) is active.
  node.rec.set_spare(req.spare() && HostedRanksLocked(req.node_id()) == 0);
  node.rec.set_epoch(next_epoch_++);
  node.rec.set_health(v1::ALIVE);
  node.rec.clear_dead_reason();
  // A new check: judged afresh (a failure logs HEALTH_FAILED again).
  *node.rec.mutable_health_report() = req.health_report();
  node.rec.set_net_probe_port(req.net_probe_port());
  ++net_nodes_version_;  // the network check's node set may have changed
  node.rec.set_domain(req.domain());
  node.rec.set_replica_port(req.replica_port());
  node.rec.clear_unhealthy();
  node.rec.clear_unhealthy_check();
  node.rec.clear_unhealthy_reason();
  node.claims.Clear();  // its report, the suspect check included, is new
  SetLiveLocked(node);
  const int64_t now = options_.now_ms();
  node.health_checked_ms = now;
  node.health_requested = 0;
  node.live->last_seen_ms = now;
  int64_t expiry = next_expiry_ms_.load();
  while (expiry > now + options_.heartbeat_timeout.count() &&
         !next_expiry_ms_.compare_exchange_weak(
             expiry, now + options_.heartbeat_timeout.count())) {
  }
  batch.PutNode(node.rec);
  LogLocked(
      &batch, v1::NODE_REGISTERED, "", req.node_id(),
      absl::StrCat("epoch ", node.rec.epoch(), ", capacity ", req.capacity(),
                   node.rec.spare() ? ", spare" : ", active"));
  JudgeHealthLocked(&batch, &req.node_id());
  // Only a node that can end the wait makes a plan (its own lost ranks come
  // back, or a spare has room): any other registration changes nothing.
  for (auto& [name, job] : jobs_)
    if (job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE &&
        (job.ranks_by_node.count(req.node_id()) ||
         (node.rec.spare() && Placeable(node.rec))))
      MakePlanLocked(&batch, job,
                     absl::StrCat("node ", req.node_id(), " registered"));
  v1::RegisterNodeResponse resp;
  resp.set_epoch(node.rec.epoch());
  resp.set_heartbeat_timeout_ms(
      static_cast<uint32_t>(options_.heartbeat_timeout.count()));
  resp.set_heartbeat_interval_ms(HeartbeatIntervalLocked());
  resp.set_incarnation(incarnation_.load());
  // The window starts when the node has its epoch, not before: a storm's
  // group commits may take longer than the timeout.
  NodeLiveness* live = node.live;
  live->answered = false;
  absl::StatusOr<v1::RegisterNodeResponse> r = txn.Commit(resp);
  {
    std::shared_lock<std::shared_mutex> lock(live_mu_);
    if (live->epoch == resp.epoch()) {
      live->last_seen_ms =
          std::max(live->last_seen_ms.load(), options_.now_ms());
      live->answered = true;
    }
  }
  return r;
}

absl::Status Coordinator::ValidateHeartbeat(const v1::HeartbeatRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateProgress(req));
  CKPT_RETURN_IF_ERROR(ValidateNetResults(req));
  CKPT_RETURN_IF_ERROR(ValidateReplicaRefusal(req));
  return ValidateHealthReport(req.health_report(), "health_report");
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(
    const v1::HeartbeatRequest& req) {
  // Every return answers it, a refusal included: the server heard it
  // before this call (owed an answer), and the node waits for one.
  absl::Cleanup answered = [&] {
    HeartbeatAnswered(req.node_id(), req.epoch());
  };
  HeartbeatCall call{.req = &req};
  uint64_t durable_seq = 0;
  (void)HeartbeatGroup({&call}, /*try_lock=*/false, &durable_seq);
  // A refusal built on changes not yet durable waits for them; a failed
  // write is the answer then.
  if (durable_seq != 0) CKPT_RETURN_IF_ERROR(WaitDurable(durable_seq));
  return std::move(call.out);
}

std::optional<absl::StatusOr<v1::HeartbeatResponse>> Coordinator::TryHeartbeat(
    const v1::HeartbeatRequest& req, uint64_t* durable_seq) {
  absl::Cleanup answered = [&] {
    HeartbeatAnswered(req.node_id(), req.epoch());
  };
  HeartbeatCall call{.req = &req};
  if (!HeartbeatGroup({&call}, /*try_lock=*/true, durable_seq)) {
    std::move(answered).Cancel();  // the queued Heartbeat answers it
    return std::nullopt;
  }
  return std::move(call.out);
}

bool Coordinator::HeartbeatGroup(const std::vector<HeartbeatCall*>& calls,
                                 bool try_lock, uint64_t* durable_seq) {
  *durable_seq = 0;
  std::vector<HeartbeatCall*> valid;
  valid.reserve(calls.size());
  for (HeartbeatCall* c : calls) {
    c->valid = false;
    if (absl::Status s = ValidateHeartbeat(*c->req); !s.ok()) {
      c->out = std::move(s);
      continue;
    }
    c->valid = true;
    // Liveness first, without the state mutex: a heartbeat counts even if
    // reports or a plan hold the state for a while.
    Heard(c->req->node_id(), c->req->epoch());
    valid.push_back(c);
  }
  if (valid.empty()) return true;
  if (try_lock) {
    if (!mu_.TryLock()) return false;
  } else {
    mu_.Lock();
  }
  Txn txn(this, Txn::Adopt{});
  bool refused = false;
  for (HeartbeatCall* c : valid) {
    v1::HeartbeatResponse resp;
    // A refusal changes nothing (HeartbeatLocked); the calls before and
    // after it keep their own answers.
    absl::Status s = HeartbeatLocked(txn.batch(), *c->req, &resp);
    if (s.ok()) {
      c->out = std::move(resp);
    } else {
      c->out = std::move(s);
      refused = true;
    }
  }
  // A refusal with changes in the batch (timeouts detected above) is
  // answered once they are durable, as a lone call's Commit would; an
  // accepted heartbeat never waits.
  if (refused && !txn.batch()->empty()) {
    *durable_seq = txn.EnqueueForWait();
    return true;
  }
  txn.Enqueue();
  return true;
}

absl::Status Coordinator::WaitDurable(uint64_t seq) {
  return committer_->Wait(seq);
}

absl::Status Coordinator::HeartbeatLocked(Batch* batch,
                                          const v1::HeartbeatRequest& req,
                                          v1::HeartbeatResponse* resp) {
  CKPT_RETURN_IF_ERROR(CheckEpochLocked(req.node_id(), req.epoch()));
  CKPT_RETURN_IF_ERROR(orders_.CheckAcks(req.node_id(), req.acked_order_ids()));
  ApplyAcksLocked(batch, req);
  NoteProgressLocked(req, options_.now_ms());
  DetectHangsLocked(batch, options_.now_ms());
  resp->set_incarnation(incarnation_.load());
  resp->set_heartbeat_interval_ms(HeartbeatIntervalLocked());
  NetCheckLocked(batch, req, resp);
  HealthRecheckLocked(batch, req, resp);
  DeliverOrdersLocked(batch, req.node_id(), resp);
  AddAssignments(jobs_, req.node_id(), resp);
  ReplicaTargetForLocked(batch, req, resp);
  return absl::OkStatus();
}

uint32_t Coordinator::HeartbeatIntervalLocked() const {
  // Every registered node, dead ones too: an upper bound kept in O(1).
  return static_cast<uint32_t>(
      HeartbeatIntervalMs(options_.heartbeat_timeout.count(), nodes_.size(),
                          options_.heartbeat_interval_nodes));
}

void Coordinator::Heard(const std::string& node_id, uint64_t epoch) {
  std::shared_lock<std::shared_mutex> live(live_mu_);
  auto it = live_.find(node_id);
  if (it == live_.end() || !it->second->alive || it->second->epoch != epoch)
    return;
  MoveWindowLocked(*it->second, /*owed=*/true);
}

void Coordinator::HeartbeatAnswered(const std::string& node_id,
                                    uint64_t epoch) {
  std::shared_lock<std::shared_mutex> live(live_mu_);
  auto it = live_.find(node_id);
  if (it == live_.end() || !it->second->alive || it->second->epoch != epoch)
    return;
  MoveWindowLocked(*it->second, /*owed=*/false);
}

void Coordinator::MoveWindowLocked(NodeLiveness& node, bool owed) {
  const int64_t now = options_.now_ms();
  const int64_t timeout = options_.heartbeat_timeout.count();
  // A node already past its timeout (counted from when the coordinator
  // could hear) is left to the detector.
  if (now - WindowStart(node, now, hearing_.heard_since_ms(), timeout) >
      timeout)
    return;
  int64_t last = node.last_seen_ms.load();
  while (last < now && !node.last_seen_ms.compare_exchange_weak(last, now)) {
  }
  node.owed_since_ms = owed ? now : 0;
}

void Coordinator::ApplyAcksLocked(Batch* batch,
                                  const v1::HeartbeatRequest& req) {
  const std::vector<v1::Order> acked =
      orders_.Acknowledge(batch, req.acked_order_ids());
  std::set<std::string> acked_jobs;
  for (const v1::Order& o : acked) {
    LogLocked(
        batch, v1::ORDER_ACKED, o.job(), req.node_id(),
        absl::StrCat("order ", o.id(), " ", v1::OrderKind_Name(o.kind())));
    acked_jobs.insert(o.job());
  }
  OrdersGoneLocked(acked);
  for (const std::string& job : acked_jobs) {
    auto j = jobs_.find(job);
    if (j != jobs_.end()) UpdatePlanProgressLocked(batch, j->second);
  }
}

void Coordinator::DeliverOrdersLocked(Batch* batch, const std::string& node_id,
                                      v1::HeartbeatResponse* resp) {
  for (OrderBook::Delivery& d : orders_.Deliver(batch, node_id)) {
    const v1::Order& order = d.order;
    if (d.first)
      LogLocked(
          batch, v1::ORDER_SENT, order.job(), node_id,
          absl::StrCat("order ", order.id(), " ",
                       v1::OrderKind_Name(order.kind()), " step ",
                       order.has_step() ? absl::StrCat(order.step()) : "none",
                       " ranks ", absl::StrJoin(order.ranks(), ",")));
    *resp->add_orders() = std::move(d.order);
  }
}

absl::StatusOr<v1::RegisterJobResponse> Coordinator::RegisterJob(
    const v1::RegisterJobRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  if (req.world_size() == 0 || req.world_size() > kMaxWorldSize)
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", req.world_size(), " not in [1, ", kMaxWorldSize, "]"));
  if (req.has_min_world_size() &&
      (req.min_world_size() == 0 || req.min_world_size() > req.world_size()))
    return absl::InvalidArgumentError(
        absl::StrCat("min_world_size: ", req.min_world_size(), " not in [1, ",
                     req.world_size(), "] (the job's world_size)"));
  if (req.has_world_size_multiple() && req.world_size_multiple() == 0)
    return absl::InvalidArgumentError("world_size_multiple: 0, not >= 1");
  // The job's own values, else the coordinator's (which never make a job
  // shrink below a multiple, nor above its world size).
  const uint32_t multiple = req.has_world_size_multiple()
                                ? req.world_size_multiple()
                                : options_.world_size_multiple;
  uint32_t min_world =
      req.has_min_world_size()
          ? req.min_world_size()
          : std::min(options_.min_world_size, req.world_size());
  if (min_world % std::max(multiple, 1u) != 0) {
    if (req.has_min_world_size())
      return absl::InvalidArgumentError(
          absl::StrCat("min_world_size: ", min_world, " is not a multiple of ",
                       "world_size_multiple ", multiple));
    min_world += multiple - min_world % multiple;  // the least allowed above
    if (min_world > req.world_size()) min_world = 0;
  }
  Txn txn(this);
  Batch& batch = *txn.batch();
  v1::RegisterJobResponse resp;
  auto existing = jobs_.find(req.job());
  if (existing != jobs_.end()) {
    // A running shrunk job keeps its registered size: a launcher that
    // comes back registers that one.
    const v1::JobRecord& had = existing->second.rec;
    const uint32_t full = FullWorldSize(had);
    if (full != req.world_size())
      return txn.Commit(absl::AlreadyExistsError(absl::StrCat(
          "job: \"", req.job(), "\" is registered with world_size ", full,
          ", not ", req.world_size())));
    if ((req.has_min_world_size() &&
         req.min_world_size() != had.min_world_size()) ||
        (req.has_world_size_multiple() &&
         req.world_size_multiple() != std::max(had.world_size_multiple(), 1u)))
      return txn.Commit(absl::AlreadyExistsError(absl::StrCat(
          "job: \"", req.job(), "\" is registered with min_world_size ",
          had.min_world_size(), " and world_size_multiple ",
          std::max(had.world_size_multiple(), 1u), ", not ",
          req.min_world_size(), " and ", req.world_size_multiple())));
    *resp.mutable_job() = had;
    return txn.Commit(resp);
  }
  v1::JobRecord rec;
  rec.set_job(req.job());
  rec.set_world_size(req.world_size());
  rec.set_full_world_size(req.world_size());
  rec.set_min_world_size(min_world);
  rec.set_world_size_multiple(multiple);
  rec.set_nproc_per_node(req.nproc_per_node());
  uint32_t next_rank = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.rec.spare() || !Placeable(n.rec) || n.low_figure_recheck != 0)
      continue;
    uint32_t used = HostedRanksLocked(id);
    uint32_t free = n.rec.capacity() > used ? n.rec.capacity() - used : 0;
    // Each launcher runs nproc_per_node trainers: no node gets more.
    if (req.nproc_per_node() > 0) free = std::min(free, req.nproc_per_node());
    for (; free > 0 && next_rank < req.world_size(); --free, ++next_rank)
      rec.add_rank_node(id);
  }
  if (next_rank < req.world_size())
    return txn.Commit(absl::FailedPreconditionError(absl::StrCat(
        "world_size: ", req.world_size(),
        " ranks, but alive active healthy uncordoned nodes have room for ",
        next_rank)));
  JobState& job = jobs_[req.job()];
  job.rec = rec;
  IndexJobLocked(job);
  PutJobLocked(&batch, job);
  LogLocked(&batch, v1::JOB_REGISTERED, req.job(), "",
            absl::StrCat(
                "world_size ", req.world_size(),
                min_world != 0 && min_world < req.world_size()
                    ? absl::StrCat(" (shrinks to ", min_world,
                                   " at least, in multiples of ", multiple, ")")
                    : std::string(),
                ", ranks on ", absl::StrJoin(rec.rank_node(), ",")));
  *resp.mutable_job() = rec;
  return txn.Commit(resp);
}

absl::StatusOr<v1::ReportTrainerExitResponse> Coordinator::ReportTrainerExit(
    const v1::ReportTrainerExitRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeAndJob(req.node_id(), req.job()));
  Txn txn(this);
  Batch& batch = *txn.batch();
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  absl::StatusOr<JobState*> job =
      s.ok() ? HostedRankLocked(req.node_id(), req.job(), req.rank())
             : absl::StatusOr<JobState*>(s);
  if (!job.ok()) return txn.Commit(job.status());
  const uint32_t world = (*job)->rec.world_size();
  if (static_cast<uint32_t>(req.lost_peer_ranks_size()) > world)
    return txn.Commit(absl::InvalidArgumentError(
        absl::StrCat("lost_peer_ranks: ", req.lost_peer_ranks_size(),
                     " ranks, more than the job's ", world)));
  for (uint32_t r : req.lost_peer_ranks())
    if (r >= world)
      return txn.Commit(absl::InvalidArgumentError(absl::StrCat(
          "lost_peer_ranks: rank ", r, " not below world size ", world)));
  if (req.process_kept() &&
      (!req.peer_lost() || req.exit_code() != 0 || req.term_signal() != 0))
    return txn.Commit(absl::InvalidArgumentError(
        "process_kept: a running trainer's report needs peer_lost, and no "
        "exit code or signal"));
  v1::ReportTrainerExitResponse resp;
  if (req.has_generation() && req.generation() < (*job)->rec.generation()) {
    // Its generation was already replaced by a plan: this exit is a retry
    // whose first answer was lost (a slow commit, a failover), or a trainer
    // being stopped for the new generation. Planning again would restart
    // every rank once more.
    resp.set_generation((*job)->rec.generation());
    return txn.Commit(resp);
  }
  // A trainer kept in its process lost its peers and waits for a plan: a
  // failure, suspected to be another's, exactly like a peer-lost exit.
  std::string how = req.process_kept() ? std::string(
                                             "lost peers (its process is kept, "
                                             "waiting for a plan)")
                    : req.term_signal() != 0
                        ? absl::StrCat("killed by signal ", req.term_signal())
                        : absl::StrCat("exited with code ", req.exit_code());
  if (req.exit_code() == 0 && req.term_signal() == 0 && !req.process_kept()) {
    LogLocked(&batch, v1::TRAINER_FINISHED, req.job(), req.node_id(),
              absl::StrCat("rank ", req.rank(), " ", how));
    (*job)->watch.finished.insert(req.rank());  // no longer watched
    // Older generations' reports were answered above: this is the current.
    const uint64_t gen = (*job)->rec.generation() + 1;
    if ((*job)->clean_exit_gen != gen) {
      (*job)->clean_exit_gen = gen;
      (*job)->clean_exits.clear();
    }
    (*job)->clean_exits.insert(req.rank());
  } else if (const std::string cause = absl::StrCat(
                 "trainer of rank ", req.rank(), " ", how,
                 req.peer_lost() && !req.process_kept() ? " after losing peers"
                                                        : "");
             HoldExitLocked(&batch, **job, req, cause)) {
    // Maybe a symptom of a peer's death: planned once the probe answers
    // (coordinator_probe.cc).
    resp.set_failure(true);
    resp.set_held(true);
  } else {
    LogLocked(&batch, v1::FAILURE_DETECTED, req.job(), req.node_id(), cause);
    options_.metrics->FailureDetected(metric::kTrainerExit);
    // Repeated on this node: cordoned, which plans (its ranks to a spare).
    if (!ChargeIncidentLocked(&batch, req.node_id(), req.job(),
                              (*job)->rec.generation(), cause))
      MakePlanLocked(&batch, **job, cause, req.node_id());
    resp.set_failure(true);
  }
  resp.set_generation((*job)->rec.generation());
  return txn.Commit(resp);
}

absl::Status Coordinator::CheckRollbackLocked(
    const v1::RollbackRequest& req) const {
  auto it = jobs_.find(req.job());
  if (it == jobs_.end())
    return absl::NotFoundError(
        absl::StrCat("job: \"", req.job(), "\" is not registered"));
  const v1::JobRecord& rec = it->second.rec;
  if (std::find(rec.manifest_steps().begin(), rec.manifest_steps().end(),
                req.step()) == rec.manifest_steps().end())
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " of job ", req.job(),
        " is not durable on every rank (last good: ",
        rec.has_last_good() ? absl::StrCat(rec.last_good_step()) : "none",
        ")"));
  if (rec.plan_state() == v1::PLAN_WAITING_FOR_NODE)
    return absl::FailedPreconditionError(
        absl::StrCat("job: ", req.job(), " has ranks without a host"));
  return absl::OkStatus();
}

absl::StatusOr<v1::RollbackResponse> Coordinator::Rollback(
    const v1::RollbackRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  Txn txn(this);
  absl::Status s = CheckRollbackLocked(req);
  if (!s.ok()) return txn.Commit(s);
  // The manifest is read without the state mutex (an s3:// shared root may
  // retry for a minute); what the timeouts changed keeps its place in line.
  txn.Unlock();
  absl::StatusOr<storage::v1::GlobalManifest> manifest =
      storage::ReadGlobalManifest(*shared_, req.job(), req.step());
  txn.Relock();
  Batch& batch = *txn.batch();
  s = CheckRollbackLocked(req);  // the state may have moved meanwhile
  if (s.ok() && manifest.ok()) {
    // Only the write the commit refers to (a deposed leader's late write
    // is not it); the committed one may be kept, or be the same shards.
    const v1::JobRecord& rec = jobs_.at(req.job()).rec;
    absl::Status stamped = CheckStampLocked(rec, *manifest);
    if (!stamped.ok()) {
      std::optional<storage::v1::GlobalManifest> committed =
          CommittedManifestLocked(rec, req.step(), &*manifest);
      if (committed)
        manifest = std::move(*committed);
      else
        manifest = stamped;
    }
  }
  if (s.ok() && !manifest.ok()) {
    LogLocked(&batch, v1::MANIFEST_INVALID, req.job(), "",
              std::string(manifest.status().message()));
    s = manifest.status();
  }
  if (!s.ok()) return txn.Commit(s);
  auto it = jobs_.find(req.job());
  JobState& job = it->second;
  LogLocked(&batch, v1::ROLLBACK, req.job(), "",
            absl::StrCat("to step ", req.step()));
  job.rec.set_generation(job.rec.generation() + 1);
  auto* steps = job.rec.mutable_manifest_steps();
  steps->erase(std::remove_if(steps->begin(), steps->end(),
                              [&](uint64_t st) { return st > req.step(); }),
               steps->end());
  auto* stamps = job.rec.mutable_manifest_stamps();
  for (auto it = stamps->begin(); it != stamps->end();)
    it = it->first > req.step() ? stamps->erase(it) : std::next(it);
  job.rec.set_has_last_good(true);
  job.rec.set_last_good_step(req.step());
  job.rec.set_last_good_world_size(manifest->world_size());
  // An operator's restart at a step: a held job runs again, its plans
  // counted afresh.
  job.rec.set_plans_since_commit(0);
  job.rec.clear_held_reason();
  RememberManifestLocked(&batch, *manifest);  // after the steps it undid
  DropOrdersOfJobLocked(&batch, req.job());
  DropStepsAfterLocked(&batch, job, req.step());
  // A step saved before the job resized: each rank restores a saved one.
  RemapRestoreLocked(job, req.step(), manifest->world_size());
  IssueOrdersLocked(&batch, job, req.step(), &*manifest);
  v1::RollbackResponse resp;
  resp.set_generation(job.rec.generation());
  return txn.Commit(resp);
}

absl::StatusOr<v1::ResumeResponse> Coordinator::Resume(
    const v1::ResumeRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  Txn txn(this);
  Batch& batch = *txn.batch();
  auto it = jobs_.find(req.job());
  if (it == jobs_.end())
    return txn.Commit(absl::NotFoundError(
        absl::StrCat("job: \"", req.job(), "\" is not registered")));
  JobState& job = it->second;
  if (job.rec.plan_state() != v1::PLAN_HELD)
    return txn.Commit(absl::FailedPreconditionError(
        absl::StrCat("job: ", req.job(), " is not held (plan state ",
                     v1::PlanState_Name(job.rec.plan_state()), ")")));
  LogLocked(&batch, v1::JOB_RESUMED, req.job(), "",
            absl::StrCat("planning again; it was ", job.rec.held_reason()));
  job.rec.set_plans_since_commit(0);
  job.rec.clear_held_reason();
  job.rec.set_plan_state(v1::PLAN_NONE);
  MakePlanLocked(&batch, job, "resumed by an operator");
  v1::ResumeResponse resp;
  resp.set_generation(job.rec.generation());
  return txn.Commit(resp);
}

}  // namespace ckpt::coordinator
