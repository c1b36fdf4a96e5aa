// Launcher: warm processes (--warm N, see ckptrun.h). A rank started anew
// after a failure would otherwise wait for a fresh interpreter's imports
// (torch, its allocator, a device context) while the survivors wait for it
// in the new generation's rendezvous; a warm process has done all of that
// and only waits for its `plan`. It runs the trainer command with its own
// $CKPT_RESTART_DIR, CKPT_WARM=1, the node's CKPT_SOCKET and CKPT_JOB, and
// no rank: the trainer (ckpt.torch.resilient, ckpt-worker) writes
// `capable` and polls for the plan, from which it takes its rank, world,
// rendezvous and restore step. Once placed it is a trainer like any other.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "tools/ckptrun.h"

extern char** environ;

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

// Warm processes that die in a row with none ready between: a command that
// cannot start (or does not know CKPT_WARM) is not forked forever.
constexpr uint32_t kMaxWarmDeaths = 5;
constexpr std::chrono::milliseconds kFirstBackoff{200};
// A process placed after a failure restores and trains its first steps
// now: the refill's imports (seconds of CPU) wait that long, so they do
// not slow the recovery they are meant to speed up.
constexpr std::chrono::seconds kRefillAfterPlace{3};

// What a warm process that is not placed leaves behind: its restart
// directory and its notes' files.
void RemoveWarmFiles(const std::string& dir, const std::string& peer_lost,
                     const std::string& stacks) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (const std::string& f : {peer_lost, stacks})
    if (!f.empty()) std::filesystem::remove(f, ec);
}

// `from` is also named `to` (replacing what `to` named): the launcher reads
// a rank's notes by the rank's name, the warm process writes them by its own.
absl::Status LinkAs(const std::string& from, const std::string& to) {
  if (from.empty() || to.empty()) return absl::OkStatus();
  ::unlink(to.c_str());
  if (::link(from.c_str(), to.c_str()) != 0)
    return absl::InternalError(
        absl::StrCat("link ", from, " as ", to, ": ", std::strerror(errno)));
  return absl::OkStatus();
}

}  // namespace

void Launcher::StartWarm() {
  const std::string dir = NewRestartDir();
  if (dir.empty()) return;  // logged
  const uint64_t id = ++warm_made_;
  WarmProc w;
  w.dir = dir;
  w.peer_lost = LauncherFile(absl::StrCat("warm-", id, ".peer-lost"), true);
  w.stacks = LauncherFile(absl::StrCat("warm-", id, ".pystacks"), false);
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (!LauncherSetsVariable(*e)) env.emplace_back(*e);
  env.push_back("CKPT_WARM=1");
  env.push_back(absl::StrCat("CKPT_RESTART_DIR=", dir));
  env.push_back(absl::StrCat("CKPT_SOCKET=", opts_.socket));
  env.push_back(absl::StrCat("CKPT_JOB=", opts_.job));
  // Placed, it joins its generation's store as a client of this launcher
  // when the launcher serves it, as every trainer started here does.
  if (rendezvous_->serves()) env.push_back("CKPT_RENDEZVOUS=launcher");
  if (!w.peer_lost.empty())
    env.push_back(absl::StrCat("CKPT_PEER_LOST_FILE=", w.peer_lost));
  if (!w.stacks.empty())
    env.push_back(absl::StrCat("CKPT_STACKS_FILE=", w.stacks));
  absl::StatusOr<pid_t> pid =
      trainers_.StartWarm(opts_.program, opts_.command, env);
  if (!pid.ok()) {
    Log(absl::StrCat("warm process: ", pid.status().message()));
    RemoveWarmFiles(dir, w.peer_lost, w.stacks);
    ++warm_deaths_;
    warm_next_ = std::chrono::steady_clock::now() + kFirstBackoff;
    return;
  }
  w.pid = *pid;
  Log(absl::StrCat("warm process started (pid ", w.pid, ", ", dir, ")"));
  warm_.push_back(std::move(w));
}

void Launcher::TendWarm() {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [pid, exit] : trainers_.TakeWarmExits()) {
    auto it =
        std::find_if(warm_.begin(), warm_.end(),
                     [pid = pid](const WarmProc& w) { return w.pid == pid; });
    if (it == warm_.end()) continue;
    RemoveWarmFiles(it->dir, it->peer_lost, it->stacks);
    warm_.erase(it);
    ++warm_deaths_;
    if (warm_deaths_ >= kMaxWarmDeaths) {
      if (!warm_given_up_)
        Log(absl::StrCat("warm process (pid ", pid, ") ", DescribeExit(exit),
                         "; ", warm_deaths_,
                         " died in a row before one was ready: no more warm "
                         "processes are started (--warm)"));
      warm_given_up_ = true;
      continue;
    }
    const auto backoff = kFirstBackoff * (1 << (warm_deaths_ - 1));
    warm_next_ = std::max(warm_next_, now + backoff);
    Log(absl::StrCat("warm process (pid ", pid, ") ", DescribeExit(exit),
                     "; another is started in ", backoff.count(), " ms"));
  }
  for (WarmProc& w : warm_) {
    if (w.ready) continue;
    absl::StatusOr<std::string> text =
        restart::ReadFile(w.dir, restart::kCapableFile);
    if (!text.ok() && absl::IsNotFound(text.status())) continue;
    absl::StatusOr<int64_t> pid = text.ok()
                                      ? restart::ParseCapable(*text)
                                      : absl::StatusOr<int64_t>(text.status());
    if (pid.ok() && *pid != w.pid)
      pid = absl::InvalidArgumentError(absl::StrCat(
          "pid: ", *pid, " is not the warm process's (ckptrun started ", w.pid,
          ")"));
    if (!pid.ok()) {
      const std::string why(pid.status().message());
      if (why != w.bad_capable)
        Log(absl::StrCat("warm process (pid ", w.pid, "): ", w.dir,
                         "/capable: ", why, "; not used"));
      w.bad_capable = why;
      continue;
    }
    w.ready = true;
    warm_deaths_ = 0;
    Log(absl::StrCat("warm process (pid ", w.pid, ") ready"));
  }
  while (!warm_given_up_ && warm_.size() < opts_.warm && now >= warm_next_) {
    const size_t before = warm_.size();
    StartWarm();
    if (warm_.size() == before) break;  // logged; tried again after back-off
  }
}

bool Launcher::PlaceWarm(const cv1::JobView& job, uint32_t rank) {
  // A warm process takes a plan newer than generation 0 (it polls for one
  // after 0, as every trainer polls for one after its own): generation
  // 0's ranks start as fresh processes.
  if (warm_.empty() || !generation_ || *generation_ == 0) return false;
  // A restore at another world size goes to a fresh process, whose
  // environment names the saved rank (StartRanks).
  if (job.restore_world_size() != 0) return false;
  for (auto it = warm_.begin(); it != warm_.end(); ++it) {
    if (!it->ready || !trainers_.WarmAlive(it->pid)) continue;
    const RestartPlan plan = PlanFor(job, rank);
    if (absl::Status s = restart::WriteFile(it->dir, restart::kPlanFile,
                                            restart::FormatPlan(plan));
        !s.ok()) {
      Log(absl::StrCat(GenerationPrefix(), "rank ", rank,
                       ": warm process (pid ", it->pid, "): ", s.message()));
      continue;
    }
    if (!trainers_.Place(it->pid, rank)) continue;
    for (auto [from, suffix] : {std::pair{it->peer_lost, ".peer-lost"},
                                std::pair{it->stacks, ".pystacks"}}) {
      absl::Status s = LinkAs(from, RankFile(rank, suffix, false));
      if (!s.ok())
        Log(absl::StrCat(GenerationPrefix(), "rank ", rank, ": ", s.message()));
    }
    Proc& proc = procs_[rank];
    proc = Proc{};
    proc.pid = it->pid;
    proc.dir = it->dir;
    proc.generation = plan.generation;
    proc.capable = true;
    proc.own_files = {it->peer_lost, it->stacks};
    Log(absl::StrCat(
        GenerationPrefix(), "rank ", rank, " placed in a warm process (pid ",
        it->pid, ")",
        plan.restore_step
            ? absl::StrCat(" at step ", *plan.restore_step, " (restore)")
            : std::string(" (fresh)")));
    warm_.erase(it);
    warm_next_ = std::max(warm_next_,
                          std::chrono::steady_clock::now() + kRefillAfterPlace);
    return true;
  }
  return false;
}

void Launcher::StopWarm() {
  if (warm_.empty()) return;
  trainers_.StopWarm(opts_.grace);
  for (const WarmProc& w : warm_) RemoveWarmFiles(w.dir, w.peer_lost, w.stacks);
  warm_.clear();
  warm_given_up_ = true;  // the job is over on this node
}

}  // namespace ckpt::tools
