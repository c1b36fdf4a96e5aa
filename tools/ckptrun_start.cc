// Launcher: starting a rank's trainer process (see ckptrun.h): its
// torchrun environment, and for an in-process restart its own directory
// with its plan, written before it starts.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tools/ckptrun.h"

extern char** environ;

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

// Host part of a node's address, for MASTER_ADDR: "h:p" -> "h",
// "[v6]:p" -> "v6"; a Unix socket or nothing -> empty.
std::string HostOf(const std::string& address) {
  if (address.empty() || address.front() == '/' ||
      address.rfind("unix:", 0) == 0)
    return "";
  if (address.front() == '[') {
    size_t close = address.find(']');
    return close == std::string::npos ? "" : address.substr(1, close - 1);
  }
  size_t colon = address.find(':');
  if (colon == std::string::npos) return address;
  if (address.find(':', colon + 1) != std::string::npos)
    return address;  // bare IPv6
  return address.substr(0, colon);
}

// The environment of ckptrun without the variables it sets for trainers.
std::vector<std::string> InheritedEnv() {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e)
    if (!LauncherSetsVariable(*e)) env.emplace_back(*e);
  return env;
}

}  // namespace

std::optional<uint32_t> SavedRankOf(const cv1::JobView& job, uint32_t rank) {
  if (job.restore_world_size() == 0 ||
      job.restore_ranks_size() != job.ranks_size())
    return std::nullopt;
  for (int i = 0; i < job.ranks_size(); ++i)
    if (job.ranks(i) == rank && job.restore_ranks(i) < job.restore_world_size())
      return job.restore_ranks(i);
  return std::nullopt;
}

bool LauncherSetsVariable(std::string_view kv) {
  static constexpr std::string_view kSet[] = {"RANK=",
                                              "WORLD_SIZE=",
                                              "LOCAL_RANK=",
                                              "LOCAL_WORLD_SIZE=",
                                              "MASTER_ADDR=",
                                              "MASTER_PORT=",
                                              "CKPT_SOCKET=",
                                              "CKPT_JOB=",
                                              "CKPT_GENERATION=",
                                              "CKPT_RESTORE_STEP=",
                                              "CKPT_RESTORE_RANK=",
                                              "CKPT_RESTORE_WORLD_SIZE=",
                                              "CKPT_PEER_LOST_FILE=",
                                              "CKPT_RESTART_DIR=",
                                              "CKPT_STACKS_FILE=",
                                              "CKPT_WARM=",
                                              "CKPT_RENDEZVOUS="};
  for (std::string_view prefix : kSet)
    if (kv.substr(0, prefix.size()) == prefix) return true;
  return false;
}

RestartPlan Launcher::PlanFor(const cv1::JobView& job, uint32_t rank) const {
  RestartPlan plan;
  plan.generation = job.generation();
  plan.rank = rank;
  plan.world_size = job.world_size();
  plan.local_rank = static_cast<uint32_t>(
      std::distance(started_.begin(), started_.find(rank)));
  plan.local_world_size = static_cast<uint32_t>(started_.size());
  plan.master_addr = opts_.master_addr;
  if (plan.master_addr.empty()) plan.master_addr = HostOf(job.rank0_address());
  if (plan.master_addr.empty()) plan.master_addr = "127.0.0.1";
  // A store served by ckptrun lives across generations (its keys carry
  // the generation); one a trainer serves is new in each.
  plan.master_port =
      rendezvous_->serves()
          ? opts_.master_port
          : opts_.master_port + static_cast<uint32_t>(job.generation() % 1000);
  if (job.plan_state() == cv1::PLAN_NONE) {
    if (job.has_last_good())
      plan.restore_step = job.last_good_step();  // a fresh start of the job
  } else if (job.has_restore_step()) {
    plan.restore_step = job.restore_step();
  }
  return plan;
}

void Launcher::StartRanks(const cv1::JobView& job,
                          const std::vector<uint32_t>& wanted) {
  std::vector<uint32_t> ranks;  // those no warm process takes
  for (uint32_t rank : wanted)
    if (!PlaceWarm(job, rank)) ranks.push_back(rank);
  if (ranks.empty()) return;
  const RestartPlan any = PlanFor(job, ranks.front());
  Log(absl::StrCat(
      GenerationPrefix(), "start ranks ", absl::StrJoin(ranks, ","),
      any.restore_step
          ? absl::StrCat(" at step ", *any.restore_step, " (restore)")
          : std::string(" (fresh)")));
  const std::vector<std::string> inherited = InheritedEnv();
  for (uint32_t rank : ranks) {
    const RestartPlan plan = PlanFor(job, rank);
    std::vector<std::string> env = inherited;
    env.push_back(absl::StrCat("RANK=", rank));
    env.push_back(absl::StrCat("WORLD_SIZE=", plan.world_size));
    env.push_back(absl::StrCat("LOCAL_RANK=", plan.local_rank));
    env.push_back(absl::StrCat("LOCAL_WORLD_SIZE=", plan.local_world_size));
    env.push_back(absl::StrCat("MASTER_ADDR=", plan.master_addr));
    env.push_back(absl::StrCat("MASTER_PORT=", plan.master_port));
    env.push_back(absl::StrCat("CKPT_SOCKET=", opts_.socket));
    env.push_back(absl::StrCat("CKPT_JOB=", opts_.job));
    env.push_back(absl::StrCat("CKPT_GENERATION=", plan.generation));
    if (rendezvous_->serves()) env.push_back("CKPT_RENDEZVOUS=launcher");
    if (plan.restore_step)
      env.push_back(absl::StrCat("CKPT_RESTORE_STEP=", *plan.restore_step));
    // The restore step was saved at another world size: the saved rank
    // this rank restores (data parallel: any rank's shard holds the state).
    if (std::optional<uint32_t> from = SavedRankOf(job, rank);
        plan.restore_step && from) {
      env.push_back(absl::StrCat("CKPT_RESTORE_RANK=", *from));
      env.push_back(
          absl::StrCat("CKPT_RESTORE_WORLD_SIZE=", job.restore_world_size()));
    }
    if (std::string f = PythonStacksFile(rank); !f.empty())
      env.push_back(absl::StrCat("CKPT_STACKS_FILE=", f));
    if (std::string f = PeerLostFile(rank); !f.empty())
      env.push_back(absl::StrCat("CKPT_PEER_LOST_FILE=", f));
    // Its plan is there before it starts: the same values as its
    // environment, for a trainer that reads only the plan.
    std::string dir;
    if (opts_.restart_timeout.count() > 0) dir = NewRestartDir();
    if (!dir.empty()) {
      if (absl::Status s = restart::WriteFile(dir, restart::kPlanFile,
                                              restart::FormatPlan(plan));
          s.ok()) {
        env.push_back(absl::StrCat("CKPT_RESTART_DIR=", dir));
      } else {
        Log(absl::StrCat(GenerationPrefix(), "rank ", rank, ": ", s.message(),
                         "; it cannot restart in its process"));
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
        dir.clear();
      }
    }
    absl::Status s = trainers_.Start(rank, opts_.program, opts_.command, env);
    // A rank that cannot even be forked counts as a failed trainer.
    if (!s.ok()) {
      Log(absl::StrCat(GenerationPrefix(), "rank ", rank, ": ", s.message()));
      reports_.push_back(
          {TrainerExit{rank, 127, 0}, PeerLost{}, *generation_, epoch_, false});
      std::error_code ec;
      if (!dir.empty()) std::filesystem::remove_all(dir, ec);
      continue;
    }
    Proc& proc = procs_[rank];
    proc = Proc{};
    proc.pid = trainers_.Running().at(rank);
    proc.dir = dir;
    proc.generation = plan.generation;
  }
}

}  // namespace ckpt::tools
