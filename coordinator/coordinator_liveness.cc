// Coordinator: the liveness path of the ranks themselves — progress
// reports from the nodes' beacon polls, hang detection with the timeout
// model of hang_model.h, and the stacks a hang's launchers capture.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

constexpr size_t kMaxToolBytes = 64;
constexpr size_t kMaxPauseReasonBytes = 127;  // shm/beacon.h
constexpr int kMaxStackRanks = 4096;
// A node's report times are relative to its heartbeat; more than a year
// is nonsense, not a time.
constexpr uint64_t kMaxReportMs = 365ull * 24 * 3600 * 1000;

}  // namespace

absl::Status Coordinator::ValidateProgress(const v1::HeartbeatRequest& req) {
  for (int i = 0; i < req.progress_size(); ++i) {
    const v1::RankProgress& p = req.progress(i);
    const std::string field = absl::StrCat("progress[", i, "].");
    CKPT_RETURN_IF_ERROR(ValidateJobName(p.job(), field + "job"));
    CKPT_RETURN_IF_ERROR(ValidatePrintable(
        p.pause_reason(), field + "pause_reason", kMaxPauseReasonBytes,
        /*allow_empty=*/true));
    for (auto [name, v] : {std::pair<const char*, uint64_t>{
                               "ms_since_advance", p.ms_since_advance()},
                           {"ms_since_pause", p.ms_since_pause()},
                           {"pause_ms", p.pause_ms()}})
      if (v > kMaxReportMs)
        return absl::InvalidArgumentError(
            absl::StrCat(field, name, ": ", v, " ms is more than a year"));
  }
  return absl::OkStatus();
}

void Coordinator::NoteProgressLocked(const v1::HeartbeatRequest& req,
                                     int64_t now) {
  for (const v1::RankProgress& p : req.progress()) {
    auto it = jobs_.find(p.job());
    if (it == jobs_.end()) continue;
    JobState& job = it->second;
    if (p.rank() >= static_cast<uint32_t>(job.rec.rank_node_size()) ||
        job.rec.rank_node(p.rank()) != req.node_id())
      continue;  // moved by a plan: its new host reports it
    job.watch.beats[p.rank()] = ProgressWatch::BeatOf(p, now);
  }
}

void Coordinator::DetectHangsLocked(Batch* batch, int64_t now) {
  if (!progress_.ScanDue(now)) return;
  for (auto& [name, job] : jobs_) {
    JobState::HangWatch& w = job.watch;
    if (job.rec.plan_state() == v1::PLAN_ORDERED ||
        job.rec.plan_state() == v1::PLAN_WAITING_FOR_NODE ||
        job.rec.plan_state() == v1::PLAN_HELD) {
      w.generation = 0;  // trainers are being (re)started, or stay stopped
      continue;
    }
    if (w.generation != job.rec.generation() + 1) {
      // +1: generation 0 is a job's first; 0 here means "not watched".
      w.generation = job.rec.generation() + 1;
      w.start_ms = now;
      w.finished.clear();
      w.slow_windows.clear();  // a new generation is judged afresh
      w.next_window_ms = now;
    }
    std::vector<uint32_t> ranks;
    for (uint32_t r = 0; r < job.rec.world_size(); ++r)
      if (!w.finished.count(r)) ranks.push_back(r);
    if (ranks.empty()) continue;
    std::optional<HangVerdict> v =
        FindHang(options_.hang, ranks, w.beats, w.start_ms, now);
    if (!v) {
      CheckStragglersLocked(batch, job, ranks, now);
      continue;
    }
    const uint64_t hung_generation = job.rec.generation();
    std::set<std::string> nodes;
    for (uint32_t r : v->stuck) nodes.insert(job.rec.rank_node(r));
    v1::Event e;
    e.set_kind(v1::HANG_DETECTED);
    e.set_job(name);
    e.set_node_id(job.rec.rank_node(v->stuck.front()));
    e.set_detail(v->detail);
    v1::Hang* h = e.mutable_hang();
    *h->mutable_ranks() = {v->stuck.begin(), v->stuck.end()};
    h->set_has_step(v->has_step);
    h->set_step(v->step);
    h->set_timeout_s(v->timeout_s);
    h->set_silent_s(v->silent_s);
    h->set_first_step(v->first_step);
    h->set_pause_reason(v->pause_reason);
    h->set_generation(hung_generation);
    h->set_stacks(absl::StrCat("ckptctl stacks --job ", name, " --generation ",
                               hung_generation, " (captured on ",
                               absl::StrJoin(nodes, ","), ")"));
    LogLocked(batch, std::move(e));
    options_.metrics->FailureDetected(metric::kHang);
    v1::StackRequest* sr = job.rec.mutable_stack_request();
    sr->set_generation(hung_generation);
    *sr->mutable_nodes() = {nodes.begin(), nodes.end()};
    // Restart every rank from the last good step, as after a trainer
    // exit; the launchers stop the hung generation's trainers (SIGKILL
    // after their grace: a stopped process ignores SIGTERM). A node hung
    // repeatedly is cordoned instead, which plans too.
    bool planned = false;
    for (const std::string& node : nodes)
      planned |= ChargeIncidentLocked(batch, node, name, hung_generation,
                                      absl::StrCat("hang: ", v->detail));
    if (!planned) MakePlanLocked(batch, job, absl::StrCat("hang: ", v->detail));
    w.generation = 0;
  }
}

void Coordinator::CheckStragglersLocked(Batch* batch, JobState& job,
                                        const std::vector<uint32_t>& ranks,
                                        int64_t now) {
  JobState::HangWatch& w = job.watch;
  if (now < w.next_window_ms) return;
  w.next_window_ms =
      now + static_cast<int64_t>(options_.hang.straggler_window_s * 1000);
  uint32_t median = 0;
  std::vector<uint32_t> slow =
      SlowRanks(options_.hang, ranks, w.beats, &median);
  const std::string& name = job.rec.job();
  std::vector<std::pair<std::string, std::string>> evict;  // node, why
  for (uint32_t r : ranks) {
    const bool is_slow = std::find(slow.begin(), slow.end(), r) != slow.end();
    int& n = w.slow_windows[r];
    n = is_slow ? n + 1 : 0;
    const std::string& node = job.rec.rank_node(r);
    if (!is_slow && w.stragglers.erase(r)) {
      options_.metrics->SetStraggler(name, node, r, false);
      continue;
    }
    if (n != options_.hang.straggler_windows) continue;
    const RankBeat& b = w.beats.at(r);
    w.stragglers.insert(r);
    options_.metrics->SetStraggler(name, node, r, true);
    v1::Event e;
    e.set_kind(v1::STRAGGLER);
    e.set_job(name);
    e.set_node_id(node);
    const bool compute = b.compute_ms > 0;
    e.set_detail(absl::StrCat("rank ", r, " ", compute ? "compute" : "step",
                              " time ", StragglerTimeMs(b), " ms > ",
                              options_.hang.straggler_factor, " x the median ",
                              median, " ms for ", n, " windows"));
    v1::Straggler* s = e.mutable_straggler();
    s->set_rank(r);
    s->set_time_ms(StragglerTimeMs(b));
    s->set_median_ms(median);
    s->set_windows(static_cast<uint32_t>(n));
    s->set_compute(compute);
    if (options_.evict_stragglers)
      evict.emplace_back(node, absl::StrCat("straggler: ", e.detail()));
    LogLocked(batch, std::move(e));
  }
  // Replaced like a failed node, when a spare can take its ranks (else
  // EVICTION_SKIPPED says why); the plan starts a new generation.
  std::set<std::string> tried;
  for (const auto& [node, why] : evict) {
    if (!tried.insert(node).second) continue;  // its other straggler
    std::vector<uint32_t> there;  // its ranks, before the plan moves them
    for (uint32_t r : w.stragglers)
      if (job.rec.rank_node(r) == node) there.push_back(r);
    if (!EvictLocked(batch, node, name, why, "straggler")) continue;
    for (uint32_t r : there) {
      options_.metrics->SetStraggler(name, node, r, false);
      w.stragglers.erase(r);
    }
    break;  // one replacement per window
  }
}

absl::StatusOr<v1::ReportStacksResponse> Coordinator::ReportStacks(
    const v1::ReportStacksRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateNodeId(req.node_id()));
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  if (req.ranks_size() > kMaxStackRanks)
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: ", req.ranks_size(), " entries, at most ", kMaxStackRanks));
  for (int i = 0; i < req.ranks_size(); ++i) {
    const v1::RankStacks& r = req.ranks(i);
    if (r.text().size() > kMaxStackBytes)
      return absl::InvalidArgumentError(
          absl::StrCat("ranks[", i, "].text: ", r.text().size(),
                       " bytes, at most ", kMaxStackBytes));
    CKPT_RETURN_IF_ERROR(ValidatePrintable(
        r.tool(), absl::StrCat("ranks[", i, "].tool"), kMaxToolBytes,
        /*allow_empty=*/true));
  }
  // What is kept already (a read of the store): without the state mutex.
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::StackReport> kept,
                        store_->LoadStacks(req.job()));
  Txn txn(this);
  Batch& batch = *txn.batch();
  absl::Status s;
  auto job = jobs_.find(req.job());
  if (!nodes_.count(req.node_id()))
    s = absl::NotFoundError(
        absl::StrCat("node_id: \"", req.node_id(), "\" is not registered"));
  else if (job == jobs_.end())
    s = absl::NotFoundError(
        absl::StrCat("job: \"", req.job(), "\" is not registered"));
  else if (req.generation() > job->second.rec.generation())
    s = absl::InvalidArgumentError(
        absl::StrCat("generation: ", req.generation(), " is newer than job ",
                     req.job(), "'s ", job->second.rec.generation()));
  if (!s.ok()) return txn.Commit(s);
  v1::StackReport report;
  report.set_job(req.job());
  report.set_generation(req.generation());
  report.set_node_id(req.node_id());
  *report.mutable_ranks() = req.ranks();
  report.set_time_ms(options_.now_ms());
  batch.PutStacks(report);
  // Only the newest kept_stack_generations hangs (this one counted).
  std::set<uint64_t> generations{req.generation()};
  for (const v1::StackReport& k : kept) generations.insert(k.generation());
  while (generations.size() >
         std::max<size_t>(options_.kept_stack_generations, 1))
    generations.erase(generations.begin());
  for (const v1::StackReport& k : kept)
    if (!generations.count(k.generation()))
      batch.DeleteStacks(k.job(), k.generation(), k.node_id());
  std::vector<uint32_t> ranks;
  uint64_t bytes = 0;
  for (const v1::RankStacks& r : req.ranks()) {
    ranks.push_back(r.rank());
    bytes += r.text().size();
  }
  LogLocked(&batch, v1::STACKS_CAPTURED, req.job(), req.node_id(),
            absl::StrCat("generation ", req.generation(), ": stacks of ranks ",
                         RankRanges(ranks), " (", bytes,
                         " bytes): ckptctl stacks --job ", req.job(),
                         " --generation ", req.generation()));
  return txn.Commit(v1::ReportStacksResponse());
}

absl::StatusOr<v1::GetStacksResponse> Coordinator::GetStacks(
    const v1::GetStacksRequest& req) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(req.job(), "job"));
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::StackReport> kept,
                        store_->LoadStacks(req.job()));
  v1::GetStacksResponse resp;
  std::set<uint64_t> generations;
  for (const v1::StackReport& k : kept) generations.insert(k.generation());
  *resp.mutable_generations() = {generations.begin(), generations.end()};
  if (generations.empty()) return resp;
  const uint64_t want =
      req.has_generation() ? req.generation() : *generations.rbegin();
  for (v1::StackReport& k : kept)
    if (k.generation() == want) *resp.add_reports() = std::move(k);
  if (resp.reports_size() == 0)
    return absl::NotFoundError(absl::StrCat(
        "generation: ", want, " of job ", req.job(),
        " has no stacks kept (kept: ", absl::StrJoin(generations, ","), ")"));
  return resp;
}

}  // namespace ckpt::coordinator
