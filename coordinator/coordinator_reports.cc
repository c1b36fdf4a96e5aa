// Coordinator: shard reports (one, or a node's batch), the global commit
// of a step whose ranks are all durable (manifest written outside the
// state mutex, then last good moved), and restore fallbacks.
#include <algorithm>
#include <iterator>
#include <optional>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/save_digest.h"
#include "storage/layout_format.h"
#include "storage/layout_merge.h"
#include "storage/manifest.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

constexpr size_t kMaxKeyBytes = 1024;
// A trainer's age, bounded so that "now - age" cannot overflow (~100 years).
constexpr uint64_t kMaxTrainerAgeMs = uint64_t{1} << 42;
// A report reaches the coordinator some time after its trainer's age was
// taken, so a trainer looks older than it is, by that transit. A trainer
// started up to this long before a failure counts as started after it:
// never take a restarted trainer for one of the abandoned generation.
constexpr int64_t kTrainerStartSlackMs = 1000;

// The generation a trainer runs in that started `age_ms` before `now_ms`,
// judged against the failures the job's plans were made for: the newest
// generation whose failure came before it started. nullopt: unknown (no
// failure time kept for the current generation: the job's first, or a
// plan made before this coordinator started).
std::optional<uint64_t> TrainerGeneration(const JobState& job, int64_t now_ms,
                                          uint64_t age_ms) {
  auto current = job.failure_ms.find(job.rec.generation());
  if (current == job.failure_ms.end()) return std::nullopt;
  const int64_t started =
      now_ms - static_cast<int64_t>(age_ms) + kTrainerStartSlackMs;
  for (auto it = std::make_reverse_iterator(std::next(current));
       it != job.failure_ms.rend(); ++it)
    if (started >= it->second) return it->first;
  return job.failure_ms.begin()->first - 1;
}

absl::Status ValidateShardKey(const std::string& key) {
  CKPT_RETURN_IF_ERROR(ValidatePrintable(key, "key", kMaxKeyBytes));
  if (key.front() == '/' || key.find("..") != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        "key: ", QuotePrefix(key), " must be a relative key without \"..\""));
  return absl::OkStatus();
}

// The checks of one report that need no state.
[[nodiscard]] absl::Status ValidateReport(const v1::ShardReport& r) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(r.job(), "job"));
  if (r.state() != v1::STAGED && r.state() != v1::DURABLE &&
      r.state() != v1::REPLICATED)
    return absl::InvalidArgumentError(absl::StrCat(
        "state: ", r.state(), " is not STAGED, DURABLE or REPLICATED"));
  // A replica names the node whose rank it is; only a replica does.
  if (r.state() == v1::REPLICATED)
    CKPT_RETURN_IF_ERROR(ValidateNodeId(r.source_node(), "source_node"));
  else if (r.has_source_node())
    return absl::InvalidArgumentError(
        "source_node: set on a report that is not REPLICATED");
  // A STAGED report carries no key; one that does is still checked, since
  // it is kept.
  if (r.state() == v1::DURABLE || !r.key().empty())
    CKPT_RETURN_IF_ERROR(ValidateShardKey(r.key()));
  if (r.has_layout_index() && r.state() != v1::DURABLE)
    return absl::InvalidArgumentError(
        "layout_index: set on a report that is not DURABLE");
  if (r.trainer_age_ms() > kMaxTrainerAgeMs)
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_age_ms: ", r.trainer_age_ms(), " is more than ",
                     kMaxTrainerAgeMs));
  return absl::OkStatus();
}

bool IsCopyName(const std::string& copy) {
  return copy == "memory" || copy == "file" || copy == "object";
}

// The checks of a fallback report that need no state.
[[nodiscard]] absl::Status ValidateFallback(
    const v1::ReportFallbackRequest& r) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(r.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateJobName(r.job(), "job"));
  if (!IsCopyName(r.copy()))
    return absl::InvalidArgumentError(
        absl::StrCat("copy: ", QuotePrefix(r.copy()),
                     " is not \"memory\", \"file\" or \"object\""));
  CKPT_RETURN_IF_ERROR(ValidatePrintable(r.reason(), "reason",
                                         Coordinator::kMaxFallbackReasonBytes,
                                         /*allow_empty=*/true));
  if (r.has_next_step() && r.next_step() >= r.step())
    return absl::InvalidArgumentError(absl::StrCat(
        "next_step: ", r.next_step(), " is not older than step ", r.step()));
  if (!r.next_copy().empty() && !IsCopyName(r.next_copy()))
    return absl::InvalidArgumentError(
        absl::StrCat("next_copy: ", QuotePrefix(r.next_copy()),
                     " is not \"memory\", \"file\", \"object\" or empty"));
  return absl::OkStatus();
}

// "rank 3 step 40: memory copy failed verification (why); restored from
// file" (or "; fell back to step 30 [from file]").
std::string FallbackDetail(const v1::ReportFallbackRequest& r) {
  if (r.has_verified_bad() && !r.verified_bad())
    return absl::StrCat("rank ", r.rank(), " step ", r.step(), ": ", r.copy(),
                        " copy claimed bad by a restore but verified by the "
                        "node (",
                        r.reason().empty() ? "no reason given" : r.reason(),
                        "); kept: suspect the node's memory or device");
  std::string d =
      absl::StrCat("rank ", r.rank(), " step ", r.step(), ": ", r.copy(),
                   " copy failed verification (",
                   r.reason().empty() ? "no reason given" : r.reason(), ")");
  if (r.has_next_step())
    absl::StrAppend(&d, "; fell back to step ", r.next_step(),
                    r.next_copy().empty() ? "" : " from " + r.next_copy());
  else if (!r.next_copy().empty())
    absl::StrAppend(&d, "; restored from ", r.next_copy());
  else
    absl::StrAppend(&d, "; fell back");
  return d;
}

}  // namespace

bool Coordinator::RestoredSaveLocked(const JobState& job,
                                     const v1::ShardReport& r) const {
  if (!job.rec.has_restore_step() || r.step() != job.rec.restore_step())
    return false;
  // The save the plan chose: the rank's record of the step (the source's,
  // or the replacement's own once it reported it), as a replica is judged;
  // else the committed manifest's shard.
  if (auto st = job.steps.find(r.step()); st != job.steps.end()) {
    auto rk = st->second.find(r.rank());
    if (rk == st->second.end()) return false;
    const v1::ShardRecord& saved = rk->second;
    return StagedDigest(r) == StagedDigest(saved) ||
           r.checksum_digest() == StagedDigest(saved) ||
           r.checksum_digest() == saved.checksum_digest();
  }
  if (const storage::v1::GlobalManifest* m =
          KnownManifestLocked(job.rec.job(), r.step()))
    for (const auto& s : m->shards())
      if (s.rank() == r.rank())
        return s.checksum_digest() == storage::DigestHex(r.checksum_digest());
  return false;
}

absl::Status Coordinator::ApplyReportLocked(
    const std::string& node_id, uint64_t epoch, const v1::ShardReport& req,
    const RankIndex& index, Batch* batch, v1::ReportResult* result,
    std::vector<PendingCommit>* complete) {
  CKPT_RETURN_IF_ERROR(ValidateReport(req));
  if (req.state() == v1::REPLICATED)
    return ApplyReplicaReportLocked(node_id, epoch, req, batch);
  CKPT_ASSIGN_OR_RETURN(JobState * job,
                        HostedRankLocked(node_id, req.job(), req.rank()));
  // A save of a generation a plan replaced belongs to an abandoned
  // timeline (a trainer saving while it is stopped, a persist finishing
  // late): it must neither count nor recreate the records the plan
  // dropped; except the save the plan restores, which starts the new
  // timeline (a replacement's copy of it). Reports without a generation
  // are judged as before.
  if (req.has_generation() && req.generation() < job->rec.generation() &&
      !RestoredSaveLocked(*job, req))
    return absl::FailedPreconditionError(absl::StrCat(
        "generation: ", req.generation(), " of the report of step ", req.step(),
        " rank ", req.rank(), " of job ", req.job(),
        " is older than the job's generation ", job->rec.generation(),
        " (a timeline a plan abandoned); dropped"));
  // A save without a generation (a launcher other than ckptrun) is judged
  // by when its trainer started: one that started before the failure the
  // current generation answers is a process of the abandoned timeline
  // still saving (its launcher restarts it later, or never noticed); one
  // started after is the restarted trainer, whenever it started
  // relative to the plan.
  if (!req.has_generation() && req.has_trainer_age_ms()) {
    std::optional<uint64_t> g =
        TrainerGeneration(*job, options_.now_ms(), req.trainer_age_ms());
    if (g && *g < job->rec.generation() && !RestoredSaveLocked(*job, req))
      return absl::FailedPreconditionError(absl::StrCat(
          "trainer_age_ms: the trainer that saved step ", req.step(), " rank ",
          req.rank(), " of job ", req.job(), " started ", req.trainer_age_ms(),
          " ms ago, before the failure the job's generation ",
          job->rec.generation(), " answers: it runs in generation ", *g,
          " (a timeline a plan abandoned); dropped"));
  }
  if (job->rec.has_last_good() && req.step() < job->rec.last_good_step())
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " of job ", req.job(),
        " is older than the last good step ", job->rec.last_good_step()));
  const v1::ShardRecord* prior = nullptr;
  auto step = job->steps.find(req.step());
  if (step != job->steps.end()) {
    auto rank = step->second.find(req.rank());
    if (rank != step->second.end()) prior = &rank->second;
  }
  bool same_owner =
      prior && prior->node_id() == node_id && prior->epoch() == epoch;
  if (req.failed()) {
    // The node gave up persisting this save and can no longer restore it:
    // forget its STAGED record so no plan chooses the step
    // for this rank. Only that save's record goes (same node, epoch and
    // staged digest; a durable one stays); anything else is a no-op.
    if (same_owner && prior->state() != v1::DURABLE &&
        StagedDigest(*prior) == StagedDigest(req)) {
      LogLocked(
          batch, v1::SHARD_FAILED, req.job(), node_id,
          absl::StrCat(
              "step ", req.step(), " rank ", req.rank(),
              ": the node failed to persist it for good; no plan restores it"));
      step->second.erase(req.rank());
      if (step->second.empty()) EraseStepLocked(*job, req.step());
    }
    return absl::OkStatus();
  }
  bool durable_done = std::find(job->rec.manifest_steps().begin(),
                                job->rec.manifest_steps().end(),
                                req.step()) != job->rec.manifest_steps().end();
  // A node re-sending its reports to a new incarnation sends STAGED first.
  if (req.state() == v1::DURABLE && !same_owner)
    return absl::FailedPreconditionError(absl::StrCat(
        "step: ", req.step(), " rank ", req.rank(), " of job ", req.job(),
        " was never staged by node ", node_id, " at epoch ", epoch));
  // A save is named by its STAGED digest: a DURABLE report of the same save
  // may carry another checksum_digest (device tensors' checksums are
  // computed while persisting), never another staged_digest.
  const uint64_t save_digest = StagedDigest(req);
  if (same_owner &&
      (prior->bytes() != req.bytes() || StagedDigest(*prior) != save_digest))
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes/staged_digest: ", req.bytes(), "/",
        storage::DigestHex(save_digest), " for step ", req.step(), " rank ",
        req.rank(), " differ from the staged ", prior->bytes(), "/",
        storage::DigestHex(StagedDigest(*prior))));
  v1::ShardRecord rec;
  rec.set_job(req.job());
  rec.set_step(req.step());
  rec.set_rank(req.rank());
  rec.set_node_id(node_id);
  rec.set_epoch(epoch);
  // A repeated STAGED report never downgrades a DURABLE shard.
  bool keep_durable = same_owner && prior->state() == v1::DURABLE;
  rec.set_state(keep_durable ? v1::DURABLE : req.state());
  rec.set_bytes(req.bytes());
  rec.set_checksum_digest(keep_durable ? prior->checksum_digest()
                                       : req.checksum_digest());
  if (save_digest != rec.checksum_digest()) rec.set_staged_digest(save_digest);
  rec.set_key(keep_durable ? prior->key() : req.key());
  if (req.has_generation())
    rec.set_generation(req.generation());
  else if (same_owner && prior->has_generation())
    rec.set_generation(prior->generation());
  else
    rec.set_generation(job->rec.generation());
  JobState& j = *job;
  options_.metrics->StepReported(req.job(), req.step(), options_.now_ms());
  bool was_complete = j.steps[req.step()].size() == j.rec.world_size();
  const bool durable = rec.state() == v1::DURABLE;
  PutShardLocked(j, std::move(rec));
  // A DURABLE report brings the rank's index, its pieces checked
  // (ReportShards), or none (an older agent); a save not durable (again)
  // has none yet. An index of another world size than the job's (a save
  // of a timeline that resized since) is no part of the manifest the
  // job's world size names: not kept, as if the report had none (the
  // step then commits without an index).
  if (durable && req.state() == v1::DURABLE && index.blob &&
      index.world_size == j.rec.world_size())
    j.rank_indexes[req.step()][req.rank()] = index.blob;
  else if (!durable || req.state() == v1::DURABLE)
    if (auto st = j.rank_indexes.find(req.step()); st != j.rank_indexes.end())
      st->second.erase(req.rank());
  TrimStepsLocked(j);
  if (req.has_owner_uid() &&
      (!j.rec.has_owner_uid() || j.rec.owner_uid() != req.owner_uid())) {
    // A spare that prefetches this job's shards gives it to this uid.
    j.rec.set_owner_uid(req.owner_uid());
    PutJobLocked(batch, j);
  }
  bool staged = j.steps[req.step()].size() == j.rec.world_size();
  result->set_staged_everywhere(staged);
  if (staged && !was_complete)
    LogLocked(batch, v1::STEP_STAGED, req.job(), "",
              absl::StrCat("step ", req.step()));
  if (durable_done)
    result->set_durable_everywhere(true);
  else if (StepCompleteLocked(j, req.step(), complete))
    result->set_durable_everywhere(true);
  return absl::OkStatus();
}

absl::Status Coordinator::CommitSteps(
    Batch* batch, std::vector<PendingCommit> steps,
    std::set<std::pair<std::string, uint64_t>>* done,
    std::set<std::pair<std::string, uint64_t>>* dropped) {
  absl::Status first;
  while (!steps.empty()) {
    // The manifests go to the shared root without the state mutex: reports
    // and heartbeats of other nodes go on meanwhile.
    mu_.Unlock();
    std::vector<absl::Status> written;
    for (PendingCommit& c : steps) {
      // A deposed leader that knows it is deposed writes nothing. One that
      // does not know yet may still write: its commit (a fenced Txn) then
      // fails, nothing refers to its write, and AuditManifests of the new
      // leader writes the committed manifest again over it.
      if (options_.leading && !options_.leading()) {
        written.push_back(absl::UnavailableError(absl::StrCat(
            "not leader: global manifest ",
            storage::GlobalManifestKey(c.job, c.step), " not written (fence ",
            options_.fence, " is no longer the leader's)")));
        continue;
      }
      MergeStepIndex(c);
      c.content_digest = ManifestContentDigest(c.manifest);
      written.push_back(storage::WriteGlobalManifest(*shared_, c.manifest));
    }
    mu_.Lock();
    std::vector<PendingCommit> unreferenced;
    for (size_t i = 0; i < steps.size(); ++i) {
      auto job = jobs_.find(steps[i].job);
      if (job == jobs_.end()) continue;
      if (!written[i].ok()) {
        job->second.committing.erase(steps[i].step);
        if (first.ok()) first = written[i];
        continue;
      }
      if (!FinishStepLocked(batch, steps[i])) {
        // Stays "committing" while its manifest is removed: no other call
        // writes that key meanwhile.
        unreferenced.push_back(std::move(steps[i]));
        continue;
      }
      job->second.committing.erase(steps[i].step);
      if (done) done->insert({steps[i].job, steps[i].step});
      if (dropped) dropped->erase({steps[i].job, steps[i].step});
    }
    steps.clear();
    if (unreferenced.empty()) break;
    // A plan took these steps out of the timeline while their manifests
    // were written: no commit refers to them, and a manifest left behind
    // would read as a good step on the shared root.
    mu_.Unlock();
    std::vector<absl::Status> removed;
    for (const PendingCommit& c : unreferenced)
      removed.push_back(
          shared_->Delete(storage::GlobalManifestKey(c.job, c.step)));
    mu_.Lock();
    for (size_t i = 0; i < unreferenced.size(); ++i) {
      const PendingCommit& c = unreferenced[i];
      auto job = jobs_.find(c.job);
      if (job == jobs_.end()) continue;
      job->second.committing.erase(c.step);
      if (dropped) dropped->insert({c.job, c.step});
      LogLocked(batch, v1::MANIFEST_INVALID, c.job, "",
                absl::StrCat(
                    "step ", c.step,
                    ": a plan took the step out of the timeline while its "
                    "manifest was written; not committed, manifest ",
                    removed[i].ok()
                        ? "removed"
                        : absl::StrCat("not removed: ", removed[i].message())));
      // A report that completed the step meanwhile left its commit to this
      // call: made now, from the records there are.
      (void)StepCompleteLocked(job->second, c.step, &steps);
    }
  }
  return first;
}

absl::StatusOr<v1::ReportShardResponse> Coordinator::ReportShard(
    const v1::ReportShardRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  v1::ReportShardsRequest batch_req;
  batch_req.set_node_id(req.node_id());
  batch_req.set_epoch(req.epoch());
  v1::ShardReport* r = batch_req.add_reports();
  r->set_job(req.job());
  r->set_step(req.step());
  r->set_rank(req.rank());
  r->set_state(req.state());
  r->set_bytes(req.bytes());
  r->set_checksum_digest(req.checksum_digest());
  if (req.has_staged_digest()) r->set_staged_digest(req.staged_digest());
  if (req.has_generation()) r->set_generation(req.generation());
  r->set_key(req.key());
  CKPT_RETURN_IF_ERROR(
      ValidateReport(*r));  // before the state: a refusal changes nothing
  CKPT_ASSIGN_OR_RETURN(v1::ReportShardsResponse resp, ReportShards(batch_req));
  const v1::ReportResult& result = resp.results(0);
  if (result.code() != 0)
    return absl::Status(static_cast<absl::StatusCode>(result.code()),
                        result.message());
  v1::ReportShardResponse out;
  out.set_staged_everywhere(result.staged_everywhere());
  out.set_durable_everywhere(result.durable_everywhere());
  return out;
}

absl::Status Coordinator::PrepareReportCall(const v1::ReportShardsRequest& req,
                                            ReportCall* call) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  if (req.reports_size() > static_cast<int>(kMaxWorldSize))
    return absl::InvalidArgumentError(
        absl::StrCat("reports: ", req.reports_size(),
                     " in one call, more than ", kMaxWorldSize));
  // The layout indexes are checked before the state mutex is taken: a
  // rank's pieces are O(its tensors) to parse.
  call->req = &req;
  call->indexes.assign(req.reports_size(), RankIndex{});
  call->index_checks.assign(req.reports_size(), absl::OkStatus());
  for (int i = 0; i < req.reports_size(); ++i) {
    const v1::ShardReport& r = req.reports(i);
    if (!r.has_layout_index()) continue;
    absl::StatusOr<storage::LayoutIndex> parsed = storage::ParseRankLayoutIndex(
        r.layout_index(), r.rank(), /*world_size=*/0, "layout_index");
    if (!parsed.ok()) {
      call->index_checks[i] = parsed.status();
      continue;
    }
    call->indexes[i].world_size = parsed->world_size();
    call->indexes[i].blob =
        std::make_shared<const std::string>(r.layout_index());
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ReportShardsResponse> Coordinator::ReportShards(
    const v1::ReportShardsRequest& req) {
  ReportCall call;
  CKPT_RETURN_IF_ERROR(PrepareReportCall(req, &call));
  report_groups_.Run(&call, [this](const std::vector<ReportCall*>& group) {
    return ApplyReportGroup(group);
  });
  return std::move(call.out);
}

std::function<void()> Coordinator::ApplyReportGroup(
    const std::vector<ReportCall*>& group) {
  Txn txn(this);
  Batch& batch = *txn.batch();
  std::vector<PendingCommit> complete;
  std::vector<absl::Status> refused(group.size());
  std::vector<v1::ReportShardsResponse> resps(group.size());
  for (size_t g = 0; g < group.size(); ++g) {
    const v1::ReportShardsRequest& req = *group[g]->req;
    refused[g] = CheckEpochLocked(req.node_id(), req.epoch());
    if (!refused[g].ok()) continue;
    v1::ReportShardsResponse& resp = resps[g];
    resp.set_incarnation(incarnation_.load());
    for (int i = 0; i < req.reports_size(); ++i) {
      v1::ReportResult* result = resp.add_results();
      absl::Status rs = group[g]->index_checks[i];
      if (rs.ok())
        rs = ApplyReportLocked(req.node_id(), req.epoch(), req.reports(i),
                               group[g]->indexes[i], &batch, result, &complete);
      if (!rs.ok()) {
        result->Clear();
        result->set_code(static_cast<int32_t>(rs.code()));
        result->set_message(std::string(rs.message()));
      }
    }
  }
  std::set<std::pair<std::string, uint64_t>> done, dropped;
  const absl::Status s =
      CommitSteps(&batch, std::move(complete), &done, &dropped);
  // Reports of a step whose manifest could not be written fail (the node
  // retries them; the state has not moved).
  for (size_t g = 0; g < group.size(); ++g) {
    const v1::ReportShardsRequest& req = *group[g]->req;
    if (!refused[g].ok()) continue;
    for (int i = 0; i < req.reports_size(); ++i) {
      v1::ReportResult* result = resps[g].mutable_results(i);
      const std::pair<std::string, uint64_t> step{req.reports(i).job(),
                                                  req.reports(i).step()};
      // A step a plan took out of the timeline was not committed.
      if (dropped.count(step)) result->set_durable_everywhere(false);
      if (!s.ok() && result->code() == 0 && result->durable_everywhere() &&
          !done.count(step)) {
        auto job = jobs_.find(step.first);
        bool committed =
            job != jobs_.end() &&
            std::find(job->second.rec.manifest_steps().begin(),
                      job->second.rec.manifest_steps().end(),
                      step.second) != job->second.rec.manifest_steps().end();
        if (!committed) {
          result->Clear();
          result->set_code(static_cast<int32_t>(s.code()));
          result->set_message(std::string(s.message()));
        }
      }
    }
  }
  // Each call answers once the group's batch is durable (a refusal too:
  // the timeouts found on the way are committed either way).
  const uint64_t seq = txn.EnqueueForWait();
  return [this, seq, group, refused = std::move(refused),
          resps = std::move(resps)]() mutable {
    const absl::Status durable = seq == 0 ? absl::OkStatus() : WaitDurable(seq);
    for (size_t g = 0; g < group.size(); ++g) {
      if (!durable.ok())
        group[g]->out = durable;
      else if (!refused[g].ok())
        group[g]->out = refused[g];
      else
        group[g]->out = std::move(resps[g]);
    }
  };
}

absl::StatusOr<v1::ReportFallbackResponse> Coordinator::ReportFallback(
    const v1::ReportFallbackRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateFallback(req));
  Txn txn(this);
  absl::Status s = CheckEpochLocked(req.node_id(), req.epoch());
  if (s.ok())
    s = HostedRankLocked(req.node_id(), req.job(), req.rank()).status();
  if (s.ok()) {
    v1::Event e;
    e.set_kind(v1::FALLBACK);
    e.set_job(req.job());
    e.set_node_id(req.node_id());
    e.set_detail(FallbackDetail(req));
    v1::Fallback& f = *e.mutable_fallback();
    f.set_rank(req.rank());
    f.set_step(req.step());
    f.set_copy(req.copy());
    f.set_reason(req.reason());
    if (req.has_next_step()) f.set_next_step(req.next_step());
    f.set_next_copy(req.next_copy());
    if (req.has_verified_bad()) f.set_verified_bad(req.verified_bad());
    const std::string what = e.detail();
    LogLocked(txn.batch(), std::move(e));
    // A claim the node disproved is about the node, never the copy.
    if (req.has_verified_bad() && !req.verified_bad())
      NoteUnconfirmedClaimLocked(txn.batch(), req.node_id(), req.job(), what);
  }
  // Timeouts found on the way are committed either way; a refusal
  // recorded nothing of its own.
  CKPT_RETURN_IF_ERROR(txn.Commit(s));
  if (req.has_verified_bad() && !req.verified_bad())
    options_.metrics->BadCopyClaimUnconfirmed(req.node_id());
  else
    options_.metrics->RestoreFellBack(req.job(), req.copy());
  return v1::ReportFallbackResponse();
}

}  // namespace ckpt::coordinator
