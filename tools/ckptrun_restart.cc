// Launcher: in-process restart (see ckptrun.h and client/restart_plan.h). A
// trainer that can restart in its own process keeps its imports, device
// context and process group's sockets across a generation change: only
// the processes that died, or whose rank moved, are started anew. The
// trainer is trusted only as far as it is checked: its `capable` must name
// the pid ckptrun started, a `joined` must parse, and one that does not
// join in time is stopped and started anew like any other.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/ckptrun.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(static_cast<double>(d.count()) / 1000.0, " s");
}

}  // namespace

std::string Launcher::NewRestartDir() {
  const std::string base = LauncherDir();
  if (base.empty()) return "";
  std::string dir = absl::StrCat(base, "/proc-", ++procs_made_);
  if (::mkdir(dir.c_str(), 0700) != 0) {
    Log(absl::StrCat("cannot make ", dir, ": ", std::strerror(errno),
                     "; the trainer cannot restart in its process"));
    return "";
  }
  return dir;
}

void Launcher::ForgetProc(uint32_t rank) {
  auto it = procs_.find(rank);
  if (it == procs_.end()) return;
  std::error_code ec;
  if (!it->second.dir.empty()) std::filesystem::remove_all(it->second.dir, ec);
  for (const std::string& f : it->second.own_files)
    std::filesystem::remove(f, ec);
  procs_.erase(it);
}

bool Launcher::Capable(uint32_t rank, Proc& proc) {
  if (proc.capable) return *proc.capable;
  if (proc.dir.empty()) return false;
  const std::string path = proc.dir + "/capable";
  absl::StatusOr<std::string> text =
      restart::ReadFile(proc.dir, restart::kCapableFile);
  if (!text.ok() && absl::IsNotFound(text.status()))
    return false;  // not (yet) said
  absl::StatusOr<int64_t> pid = text.ok()
                                    ? restart::ParseCapable(*text)
                                    : absl::StatusOr<int64_t>(text.status());
  if (pid.ok() && *pid != proc.pid)
    pid = absl::InvalidArgumentError(
        absl::StrCat("pid: ", *pid, " is not the trainer's (ckptrun started ",
                     proc.pid, ")"));
  proc.capable = pid.ok();
  if (!pid.ok())
    Log(absl::StrCat("rank ", rank, ": ", path, ": ", pid.status().message(),
                     "; treated as not capable of an in-process restart"));
  return *proc.capable;
}

std::optional<uint64_t> Launcher::Joined(uint32_t rank, Proc& proc) {
  const std::string path = proc.dir + "/joined";
  absl::StatusOr<std::string> text =
      restart::ReadFile(proc.dir, restart::kJoinedFile);
  if (!text.ok() && absl::IsNotFound(text.status())) return std::nullopt;
  absl::StatusOr<uint64_t> g = text.ok()
                                   ? restart::ParseJoined(*text)
                                   : absl::StatusOr<uint64_t>(text.status());
  if (g.ok()) return *g;
  const std::string why(g.status().message());
  if (why != proc.bad_joined)  // once per content, not once per poll
    Log(absl::StrCat("rank ", rank, ": ", path, ": ", why,
                     "; treated as not joined"));
  proc.bad_joined = why;
  return std::nullopt;
}

void Launcher::KeepOrStop(const cv1::JobView& job,
                          const std::set<uint32_t>& desired,
                          const std::string& why) {
  const uint64_t g = job.generation();
  std::vector<uint32_t> keep, stop;
  for (uint32_t rank : trainers_.RunningRanks()) {
    auto p = procs_.find(rank);
    // A resized job's ranks restore another layout: started anew with
    // it in their environment ($CKPT_RESTORE_RANK), never kept; a held
    // job's (PLAN_HELD) wait for no plan: stopped.
    const bool keepable = opts_.restart_timeout.count() > 0 &&
                          job.plan_state() != cv1::PLAN_HELD &&
                          job.restore_world_size() == 0 &&
                          desired.count(rank) != 0 && p != procs_.end() &&
                          Capable(rank, p->second);
    (keepable ? keep : stop).push_back(rank);
  }
  StopRanks(stop, why);
  for (uint32_t rank : keep) {
    Proc& p = procs_.at(rank);
    if (p.kept_for == g) continue;  // still waiting for g's trainers
    p.kept_for = g;
    p.plan_at.reset();
    // A note written before it takes the new plan is the old generation's.
    PeerLostFile(rank);
    Log(absl::StrCat("generation ", g, ": rank ", rank,
                     " keeps its process (in-process restart)"));
  }
  generation_.reset();
  started_.clear();
  finished_.clear();
  restart_anew_.clear();
}

void Launcher::StartTrainers(const cv1::JobView& job,
                             const std::vector<uint32_t>& ranks) {
  generation_ = job.generation();
  started_ = std::set<uint32_t>(ranks.begin(), ranks.end());
  finished_.clear();
  restart_anew_.clear();
  std::vector<uint32_t> fresh;
  const auto now = std::chrono::steady_clock::now();
  const std::vector<uint32_t> running = trainers_.RunningRanks();
  for (uint32_t rank : ranks) {
    auto p = procs_.find(rank);
    const bool is_running =
        std::find(running.begin(), running.end(), rank) != running.end();
    if (!is_running || p == procs_.end() || p->second.kept_for != generation_) {
      if (is_running) StopRanks({rank}, "not kept for this generation");
      fresh.push_back(rank);
      continue;
    }
    absl::Status s =
        restart::WriteFile(p->second.dir, restart::kPlanFile,
                           restart::FormatPlan(PlanFor(job, rank)));
    if (!s.ok()) {
      Log(absl::StrCat(GenerationPrefix(), "rank ", rank, ": ", s.message()));
      StopRanks({rank}, "its plan could not be written");
      fresh.push_back(rank);
      continue;
    }
    p->second.plan_at = now;
    Log(absl::StrCat(GenerationPrefix(), "rank ", rank, " (pid ", p->second.pid,
                     "): plan written; it has ", Seconds(opts_.restart_timeout),
                     " to join"));
  }
  StartRanks(job, fresh);
}

void Launcher::TendKept(const cv1::JobView& job) {
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint32_t> late;
  for (auto& [rank, p] : procs_) {
    if (!p.kept_for || p.kept_for != generation_ || !p.plan_at) continue;
    if (Joined(rank, p) == p.kept_for) {
      p.generation = *p.kept_for;
      p.kept_for.reset();
      p.plan_at.reset();
      p.peer_lost_reported = false;
      PeerLostFile(rank);  // what it noted before it joined is not of this one
      Log(absl::StrCat(GenerationPrefix(), "rank ", rank, " (pid ", p.pid,
                       ") joined (in-process restart)"));
    } else if (now - *p.plan_at >= opts_.restart_timeout) {
      late.push_back(rank);
    }
  }
  if (!late.empty())
    Log(absl::StrCat(GenerationPrefix(), "rank(s) ", absl::StrJoin(late, ","),
                     " did not join within ", Seconds(opts_.restart_timeout),
                     " (--restart-timeout): stopped and started anew"));
  StopRanks(late, "did not join");
  late.insert(late.end(), restart_anew_.begin(), restart_anew_.end());
  restart_anew_.clear();
  std::sort(late.begin(), late.end());
  StartRanks(job, late);
}

void Launcher::ReportPeerLostOfLiveTrainers() {
  for (auto& [rank, p] : procs_) {
    // A kept trainer that has not joined is in the old generation: what it
    // says is of a generation already replaced.
    if (p.kept_for || p.peer_lost_reported || !Capable(rank, p)) continue;
    PeerLost peers = TakePeerLost(rank, world_size_);
    if (!peers.said) continue;
    p.peer_lost_reported = true;  // said once; its next word is after a plan
    PendingReport r{TrainerExit{rank, 0, 0}, std::move(peers), p.generation,
                    epoch_, false};
    r.process_kept = true;
    reports_.push_back(std::move(r));
  }
}

}  // namespace ckpt::tools
