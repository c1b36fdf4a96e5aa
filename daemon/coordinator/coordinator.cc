// Coordinator: the RPC-shaped entry points. Each validates its request,
// changes memory and a batch together, and commits the batch.
#include "daemon/coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/manifest.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

constexpr uint32_t kMaxCapacity = 1 << 16;
constexpr uint32_t kMaxWorldSize = 1 << 16;
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kMaxKeyBytes = 1024;

absl::Status ValidateShardKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxKeyBytes || key.front() == '/' ||
      key.find("..") != std::string::npos || key.find('\0') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("key: \"", key, "\" must be a relative key of 1 to ", kMaxKeyBytes,
                     " bytes without \"..\""));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::RegisterNodeResponse> Coordinator::RegisterNode(
    const v1::RegisterNodeRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.node_id(), "node_id"));
  if (req.capacity() == 0 || req.capacity() > kMaxCapacity)
    return absl::InvalidArgumentError(
        absl::StrCat("capacity: ", req.capacity(), " not in [1, ", kMaxCapacity, "]"));
  if (req.address().size() > kMaxAddressBytes)
    return absl::InvalidArgumentError(absl::StrCat("address: longer than ", kMaxAddressBytes, " bytes"));
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  auto existing = nodes_.find(req.node_id());
  if (existing != nodes_.end() && existing->second.rec.health() == v1::ALIVE) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    return absl::AlreadyExistsError(absl::StrCat(
        "node_id: \"", req.node_id(), "\" is registered and alive at epoch ",
        existing->second.rec.epoch(), "; retry after its heartbeat times out"));
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
  node.last_heartbeat_ms = options_.now_ms();
  batch.PutNode(node.rec);
  LogLocked(&batch, v1::NODE_REGISTERED, "", req.node_id(),
            absl::StrCat("epoch ", node.rec.epoch(), ", capacity ", req.capacity(),
                         node.rec.spare() ? ", spare" : ", active"));
  for (auto& [name, job] : jobs_)
    if (job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE)
      MakePlanLocked(&batch, job, absl::StrCat("node ", req.node_id(), " registered"));
  v1::RegisterNodeResponse resp;
  resp.set_epoch(node.rec.epoch());
  resp.set_heartbeat_timeout_ms(static_cast<uint32_t>(options_.heartbeat_timeout.count()));
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  if (s.ok()) {
    for (uint64_t id : req.acked_order_ids()) {
      auto it = orders_.find(id);
      if (it != orders_.end() && it->second.node_id() != req.node_id()) {
        s = absl::InvalidArgumentError(absl::StrCat("acked_order_ids: order ", id, " is for node ",
                                                    it->second.node_id(), ", not ", req.node_id()));
        break;
      }
    }
  }
  if (!s.ok()) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));  // timeouts detected above still count
    return s;
  }
  NodeState& node = nodes_[req.node_id()];
  node.last_heartbeat_ms = options_.now_ms();
  for (uint64_t id : req.acked_order_ids()) {
    auto it = orders_.find(id);
    if (it == orders_.end()) continue;  // acknowledged before: a retried heartbeat
    std::string job = it->second.job();
    LogLocked(&batch, v1::ORDER_ACKED, job, req.node_id(),
              absl::StrCat("order ", id, " ", v1::OrderKind_Name(it->second.kind())));
    batch.DeleteOrder(id);
    orders_.erase(it);
    auto j = jobs_.find(job);
    if (j != jobs_.end()) UpdatePlanProgressLocked(&batch, j->second);
  }
  v1::HeartbeatResponse resp;
  for (auto& [id, order] : orders_) {
    if (order.node_id() != req.node_id()) continue;
    if (!order.delivered()) {
      order.set_delivered(true);
      batch.PutOrder(order);
      LogLocked(&batch, v1::ORDER_SENT, order.job(), req.node_id(),
                absl::StrCat("order ", id, " ", v1::OrderKind_Name(order.kind()), " step ",
                             order.has_step() ? absl::StrCat(order.step()) : "none", " ranks ",
                             absl::StrJoin(order.ranks(), ",")));
    }
    *resp.add_orders() = order;
  }
  for (const auto& [name, job] : jobs_) {
    v1::Assignment a;
    for (uint32_t r = 0; r < job.rec.world_size(); ++r)
      if (job.rec.rank_node(r) == req.node_id()) a.add_ranks(r);
    if (a.ranks().empty()) continue;
    a.set_job(name);
    a.set_world_size(job.rec.world_size());
    a.set_generation(job.rec.generation());
    a.set_has_last_good(job.rec.has_last_good());
    a.set_last_good_step(job.rec.last_good_step());
    a.set_has_restore_step(job.rec.has_restore_step());
    a.set_restore_step(job.rec.restore_step());
    *resp.add_assignments() = std::move(a);
  }
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

absl::StatusOr<v1::RegisterJobResponse> Coordinator::RegisterJob(const v1::RegisterJobRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  if (req.world_size() == 0 || req.world_size() > kMaxWorldSize)
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", req.world_size(), " not in [1, ", kMaxWorldSize, "]"));
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  v1::RegisterJobResponse resp;
  auto existing = jobs_.find(req.job());
  if (existing != jobs_.end()) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    if (existing->second.rec.world_size() != req.world_size())
      return absl::AlreadyExistsError(absl::StrCat("job: \"", req.job(), "\" is registered with world_size ",
                                                   existing->second.rec.world_size(), ", not ",
                                                   req.world_size()));
    *resp.mutable_job() = existing->second.rec;
    return resp;
  }
  v1::JobRecord rec;
  rec.set_job(req.job());
  rec.set_world_size(req.world_size());
  uint32_t next_rank = 0;
  for (const auto& [id, n] : nodes_) {
    if (n.rec.health() != v1::ALIVE || n.rec.spare()) continue;
    uint32_t used = HostedRanksLocked(id);
    for (uint32_t free = n.rec.capacity() > used ? n.rec.capacity() - used : 0;
         free > 0 && next_rank < req.world_size(); --free, ++next_rank)
      rec.add_rank_node(id);
  }
  if (next_rank < req.world_size()) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    return absl::FailedPreconditionError(absl::StrCat(
        "world_size: ", req.world_size(), " ranks, but alive active nodes have room for ", next_rank));
  }
  JobState& job = jobs_[req.job()];
  job.rec = rec;
  batch.PutJob(rec);
  LogLocked(&batch, v1::JOB_REGISTERED, req.job(), "",
            absl::StrCat("world_size ", req.world_size(), ", ranks on ", absl::StrJoin(rec.rank_node(), ",")));
  *resp.mutable_job() = rec;
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

absl::StatusOr<v1::ReportShardResponse> Coordinator::ReportShard(const v1::ReportShardRequest& req) {
  if (req.state() != v1::STAGED && req.state() != v1::DURABLE)
    return absl::InvalidArgumentError(absl::StrCat("state: ", req.state(), " is neither STAGED nor DURABLE"));
  if (req.state() == v1::DURABLE) CKPT_RETURN_IF_ERROR(ValidateShardKey(req.key()));
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  absl::StatusOr<JobState*> job = s.ok() ? HostedRankLocked(req.node_id(), req.job(), req.rank())
                                         : absl::StatusOr<JobState*>(s);
  if (job.ok() && (*job)->rec.has_last_good() && req.step() < (*job)->rec.last_good_step())
    job = absl::FailedPreconditionError(absl::StrCat("step: ", req.step(), " of job ", req.job(),
                                                     " is older than the last good step ",
                                                     (*job)->rec.last_good_step()));
  v1::ShardRecord* prior = nullptr;
  if (job.ok()) {
    auto step = (*job)->steps.find(req.step());
    if (step != (*job)->steps.end()) {
      auto rank = step->second.find(req.rank());
      if (rank != step->second.end()) prior = &rank->second;
    }
    bool same_owner = prior && prior->node_id() == req.node_id() && prior->epoch() == req.epoch();
    if (req.state() == v1::DURABLE && !same_owner)
      job = absl::FailedPreconditionError(absl::StrCat("step: ", req.step(), " rank ", req.rank(), " of job ",
                                                       req.job(), " was never staged by node ", req.node_id(),
                                                       " at epoch ", req.epoch()));
    else if (same_owner && (prior->bytes() != req.bytes() || prior->checksum_digest() != req.checksum_digest()))
      job = absl::InvalidArgumentError(absl::StrCat(
          "bytes/checksum_digest: ", req.bytes(), "/", storage::DigestHex(req.checksum_digest()), " for step ", req.step(),
          " rank ", req.rank(), " differ from the staged ", prior->bytes(), "/", storage::DigestHex(prior->checksum_digest())));
  }
  if (!job.ok()) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    return job.status();
  }
  JobState& j = **job;
  v1::ShardRecord rec;
  rec.set_job(req.job());
  rec.set_step(req.step());
  rec.set_rank(req.rank());
  rec.set_node_id(req.node_id());
  rec.set_epoch(req.epoch());
  // A repeated STAGED report never downgrades a DURABLE shard.
  bool keep_durable = prior && prior->node_id() == req.node_id() && prior->epoch() == req.epoch() &&
                      prior->state() == v1::DURABLE;
  rec.set_state(keep_durable ? v1::DURABLE : req.state());
  rec.set_bytes(req.bytes());
  rec.set_checksum_digest(req.checksum_digest());
  rec.set_key(keep_durable ? prior->key() : req.key());
  bool was_complete = j.steps[req.step()].size() == j.rec.world_size();
  j.steps[req.step()][req.rank()] = rec;
  batch.PutShard(rec);
  v1::ReportShardResponse resp;
  resp.set_staged_everywhere(j.steps[req.step()].size() == j.rec.world_size());
  if (resp.staged_everywhere() && !was_complete)
    LogLocked(&batch, v1::STEP_STAGED, req.job(), "", absl::StrCat("step ", req.step()));
  s = MaybeCommitStepLocked(&batch, j, req.step(), &resp);
  if (!s.ok()) {
    // Leave no trace: go back to the committed state.
    absl::Status reload = ReloadLocked();
    return reload.ok() ? s : Annotate(s, absl::StrCat("and reloading failed: ", reload.message()));
  }
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

absl::StatusOr<v1::ReportTrainerExitResponse> Coordinator::ReportTrainerExit(
    const v1::ReportTrainerExitRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  absl::StatusOr<JobState*> job = s.ok() ? HostedRankLocked(req.node_id(), req.job(), req.rank())
                                         : absl::StatusOr<JobState*>(s);
  if (!job.ok()) {
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    return job.status();
  }
  v1::ReportTrainerExitResponse resp;
  std::string how = req.term_signal() != 0 ? absl::StrCat("killed by signal ", req.term_signal())
                                           : absl::StrCat("exited with code ", req.exit_code());
  if (req.exit_code() == 0 && req.term_signal() == 0) {
    LogLocked(&batch, v1::TRAINER_FINISHED, req.job(), req.node_id(), absl::StrCat("rank ", req.rank(), " ", how));
  } else {
    LogLocked(&batch, v1::FAILURE_DETECTED, req.job(), req.node_id(),
              absl::StrCat("trainer of rank ", req.rank(), " ", how));
    MakePlanLocked(&batch, **job, absl::StrCat("trainer of rank ", req.rank(), " ", how));
    resp.set_failure(true);
  }
  resp.set_generation((*job)->rec.generation());
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

absl::StatusOr<v1::RollbackResponse> Coordinator::Rollback(const v1::RollbackRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  auto it = jobs_.find(req.job());
  absl::Status s;
  if (it == jobs_.end()) {
    s = absl::NotFoundError(absl::StrCat("job: \"", req.job(), "\" is not registered"));
  } else if (std::find(it->second.rec.manifest_steps().begin(), it->second.rec.manifest_steps().end(),
                       req.step()) == it->second.rec.manifest_steps().end()) {
    s = absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " of job ", req.job(), " is not durable on every rank (last good: ",
        it->second.rec.has_last_good() ? absl::StrCat(it->second.rec.last_good_step()) : "none", ")"));
  } else if (it->second.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE) {
    s = absl::FailedPreconditionError(absl::StrCat("job: ", req.job(), " has ranks without a host"));
  }
  absl::StatusOr<storage::v1::GlobalManifest> manifest =
      s.ok() ? storage::ReadGlobalManifest(*shared_, req.job(), req.step()) : absl::StatusOr<storage::v1::GlobalManifest>(s);
  if (!manifest.ok()) {
    if (s.ok()) LogLocked(&batch, v1::MANIFEST_INVALID, req.job(), "", std::string(manifest.status().message()));
    CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
    return manifest.status();
  }
  JobState& job = it->second;
  LogLocked(&batch, v1::ROLLBACK, req.job(), "", absl::StrCat("to step ", req.step()));
  job.rec.set_generation(job.rec.generation() + 1);
  auto* steps = job.rec.mutable_manifest_steps();
  steps->erase(std::remove_if(steps->begin(), steps->end(), [&](uint64_t st) { return st > req.step(); }),
               steps->end());
  job.rec.set_has_last_good(true);
  job.rec.set_last_good_step(req.step());
  DropOrdersOfJobLocked(&batch, req.job());
  DropStepsAfterLocked(&batch, job, req.step());
  IssueOrdersLocked(&batch, job, req.step(), &*manifest);
  v1::RollbackResponse resp;
  resp.set_generation(job.rec.generation());
  CKPT_RETURN_IF_ERROR(CommitLocked(&batch));
  return resp;
}

}  // namespace ckpt::coordinator
