// Coordinator: one failure, one plan. A trainer that exits because its
// collective lost peers is usually a symptom of another node's death, not
// a failure of its own: planning it at once, and the dead node again when
// its heartbeat times out, restarts every rank twice. So such an exit
// waits while the nodes it suspects are probed (asked, through their
// WatchNode stream, to heartbeat at once): a node silent past the probe's
// deadline is dead, and the one plan made for it covers the exits that
// waited; when every suspect answers, the exits are failures of their own
// and are planned once. Any plan of the job made meanwhile (a heartbeat
// timeout, a hang) covers them too, since every rank restarts.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"

namespace ckpt::coordinator {

bool Coordinator::HoldExitLocked(Batch* batch, JobState& job,
                                 const v1::ReportTrainerExitRequest& req,
                                 const std::string& cause) {
  if (job.held_generation != job.rec.generation()) {
    job.held_exits.clear();  // a plan of another generation covered them
    job.awaited_probes.clear();
  }
  std::set<std::string> suspects;
  std::vector<uint32_t> lost;
  if (req.peer_lost()) {
    // Where the lost peers ran; unnamed: every node of the job. (A loop,
    // not a lambda: clang's lock analysis sees mu_ held here.)
    std::vector<std::string> hosts;
    if (req.lost_peer_ranks().empty()) {
      for (const auto& [host, ranks] : job.ranks_by_node) hosts.push_back(host);
    } else {
      for (uint32_t r : req.lost_peer_ranks())
        hosts.push_back(job.rec.rank_node(r));
    }
    for (const std::string& host : hosts) {
      // The reporter's own trainers are its launcher's to report.
      if (host == req.node_id()) continue;
      auto n = nodes_.find(host);
      if (n != nodes_.end() && n->second.rec.health() == v1::ALIVE)
        suspects.insert(host);
    }
  }
  if (suspects.empty() && job.awaited_probes.empty()) return false;
  const int64_t now = options_.now_ms();
  const int64_t timeout = options_.peer_probe_timeout.count();
  for (const std::string& host : suspects) {
    const NodeState& n = nodes_.at(host);
    auto [p, fresh] = probes_.try_emplace(host);
    if (fresh || p->second.epoch != n.rec.epoch()) {
      p->second = Probe{now, now + timeout, ++last_probe_id_, n.rec.epoch(),
                        req.node_id()};
      LowerNextExpiryLocked(p->second.deadline_ms + 1);
    }
    job.awaited_probes.insert(host);
  }
  job.held_generation = job.rec.generation();
  JobState::HeldExit held{
      req.node_id(), req.rank(), cause, req.peer_lost(), {}};
  if (!req.lost_peer_ranks().empty())
    held.named_hosts.assign(suspects.begin(), suspects.end());
  job.held_exits.push_back(std::move(held));
  std::string detail =
      suspects.empty()
          ? absl::StrCat(cause, "; waits for the probe of ",
                         absl::StrJoin(job.awaited_probes, ","), " under way")
          : absl::StrCat(
                cause, ": probing ", absl::StrJoin(suspects, ","),
                req.lost_peer_ranks().empty()
                    ? std::string(" (its peers unnamed: every other node)")
                    : absl::StrCat(" (peer ranks ",
                                   absl::StrJoin(req.lost_peer_ranks(), ","),
                                   ")"),
                " within ", timeout, " ms; the exit waits for the answer");
  LogLocked(batch, v1::PEER_SUSPECTED, job.rec.job(), req.node_id(), detail);
  return true;
}

void Coordinator::ExpiredProbesLocked(
    int64_t now, int64_t* next,
    std::vector<std::pair<std::string, std::string>>* dead,
    std::vector<std::string>* overdue) {
  // How often a connected node past its deadline is looked at again (its
  // connection may close meanwhile: dead then).
  constexpr int64_t kRecheckMs = 50;
  for (auto it = probes_.begin(); it != probes_.end();) {
    auto n = nodes_.find(it->first);
    Probe& p = it->second;
    // Gone meanwhile, or timed out (in this scan or found dead by its
    // probe), or answered: for AnsweredProbesLocked.
    if (n == nodes_.end() || n->second.rec.health() != v1::ALIVE ||
        n->second.rec.epoch() != p.epoch || !n->second.live->alive ||
        LastSeen(n->second) > p.started_ms) {
      ++it;
      continue;
    }
    if (now <= p.deadline_ms) {
      *next = std::min(*next, p.deadline_ms + 1);
      ++it;
      continue;
    }
    // Its process lives (its connection is open): a late answer is a
    // loaded node, not a dead one. Its heartbeat timeout still applies.
    if (auto w = watched_.find(it->first);
        w != watched_.end() && w->second > 0) {
      if (!p.overdue) {
        p.overdue = true;
        overdue->push_back(it->first);
      }
      *next = std::min(*next, now + kRecheckMs);
      ++it;
      continue;
    }
    n->second.live->alive = false;
    dead->emplace_back(
        it->first,
        absl::StrCat(p.overdue ? "its connection closed with a probe "
                                 "unanswered for "
                               : "no answer to a probe within ",
                     p.overdue ? now - p.started_ms
                               : options_.peer_probe_timeout.count(),
                     " ms (", p.by,
                     " lost its trainers' peers there); last heartbeat ",
                     now - LastSeen(n->second), " ms ago"));
    options_.metrics->PeerProbed(false);
    ++it;  // AnsweredProbesLocked drops it and tells the jobs
  }
}

void Coordinator::NodeWatchOpened(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  ++watched_[node_id];
}

void Coordinator::NodeWatchEnded(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto w = watched_.find(node_id);
  if (w == watched_.end()) return;
  if (--w->second <= 0) watched_.erase(w);
  // A probe past its deadline waits on this connection: look again now.
  auto p = probes_.find(node_id);
  if (p != probes_.end() && p->second.overdue)
    LowerNextExpiryLocked(options_.now_ms());
}

void Coordinator::AnsweredProbesLocked(Batch* batch) {
  std::set<std::string> done;
  std::vector<std::string> answered;
  for (auto it = probes_.begin(); it != probes_.end();) {
    auto n = nodes_.find(it->first);
    const Probe& p = it->second;
    if (n != nodes_.end() && n->second.rec.health() == v1::ALIVE &&
        n->second.rec.epoch() == p.epoch) {
      const int64_t last = LastSeen(n->second);
      if (last <= p.started_ms) {
        ++it;
        continue;
      }
      LogLocked(
          batch, v1::PROBE_ANSWERED, "", it->first,
          absl::StrCat("node ", it->first, " answered the probe (", p.by,
                       " lost its trainers' peers there) in ",
                       last - p.started_ms, " ms: alive, it keeps its ranks"));
      options_.metrics->PeerProbed(true);
      answered.push_back(it->first);
    }
    // Else dead meanwhile: the plan made for it covered the exits.
    done.insert(it->first);
    it = probes_.erase(it);
  }
  if (done.empty()) return;
  for (auto& [name, job] : jobs_) {
    if (job.awaited_probes.empty()) continue;
    for (const std::string& id : done) job.awaited_probes.erase(id);
    if (job.awaited_probes.empty())
      PlanHeldExitsLocked(
          batch, job,
          answered.empty()
              ? std::string("the nodes it suspected are gone")
              : absl::StrCat(absl::StrJoin(answered, ","),
                             " answered the probe: a failure of its own"),
          answered);
  }
}

void Coordinator::PlanHeldExitsLocked(
    Batch* batch, JobState& job, const std::string& why,
    const std::vector<std::string>& answered) {
  std::vector<JobState::HeldExit> held = std::move(job.held_exits);
  job.held_exits.clear();
  job.awaited_probes.clear();
  if (held.empty() || job.held_generation != job.rec.generation()) return;
  std::vector<std::string> causes;
  bool planned = false;
  for (const JobState::HeldExit& h : held) {
    LogLocked(batch, v1::FAILURE_DETECTED, job.rec.job(), h.node_id,
              absl::StrCat(h.cause, " (", why, ")"));
    options_.metrics->FailureDetected(metric::kTrainerExit);
    causes.push_back(h.cause);
    // Repeated on a node: cordoned, which plans (its ranks to a spare). A
    // lost peer is the incident of the node that hosted it and answered
    // (its trainers went, or stalled the collective), never the
    // survivor's; unnamed peers are nobody's.
    std::vector<std::string> charged;
    if (!h.peer_lost) charged.push_back(h.node_id);
    for (const std::string& host : h.named_hosts)
      if (std::find(answered.begin(), answered.end(), host) != answered.end())
        charged.push_back(host);
    for (const std::string& node : charged) {
      if (planned) break;
      planned = ChargeIncidentLocked(
          batch, node, job.rec.job(), job.rec.generation(),
          node == h.node_id
              ? h.cause
              : absl::StrCat("its ranks were lost by rank ", h.rank, " on ",
                             h.node_id, " (", h.cause,
                             ") and it answered the probe"));
    }
  }
  if (!planned) MakePlanLocked(batch, job, absl::StrJoin(causes, "; "));
}

std::string Coordinator::FoldHeldExitsLocked(JobState& job) {
  std::string folded;
  if (job.held_generation == job.rec.generation() && !job.held_exits.empty()) {
    std::vector<std::string> causes;
    for (const JobState::HeldExit& h : job.held_exits)
      causes.push_back(absl::StrCat(h.cause, " on ", h.node_id));
    folded = absl::StrCat("; folded in: ", absl::StrJoin(causes, "; "));
  }
  job.held_exits.clear();
  job.awaited_probes.clear();
  return folded;
}

}  // namespace ckpt::coordinator
