// TrainerSet: the trainer processes ckptrun runs on this node, one per rank.
// Each trainer is the leader of its own process group, so stopping it (or
// its exit) also kills whatever it forked: a wrapper (`sh -c ./train.sh`)
// and the real trainer under it go together. When ckptrun dies, even by
// SIGKILL, no trainer survives it: the direct child gets SIGKILL from
// PR_SET_PDEATHSIG, and a guardian process (forked with the first trainer,
// in no trainer's group, immune to terminal signals) holds the read end
// of a pipe only ckptrun writes: when ckptrun is gone the pipe ends and
// the guardian SIGKILLs every trainer group it was told of. ckptrun is a
// child subreaper (PR_SET_CHILD_SUBREAPER): a descendant orphaned by its
// wrapper is reparented to ckptrun, not to init, and is reaped by Reap().
// The caller owns every trainer's lifetime: Reap() hands back the trainers
// that exited on their own; StopAll() ends the rest and hands back only
// those still there kill_wait after SIGKILL (a process in uninterruptible
// sleep: a hung driver or file system). Those are reaped later by Reap(),
// silently.
// Not thread-safe; fork only from the thread that lives as long as ckptrun
// (PDEATHSIG fires when the forking thread exits).
#ifndef CKPT_TOOLS_CKPTRUN_TRAINERS_H_
#define CKPT_TOOLS_CKPTRUN_TRAINERS_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::tools {

struct TrainerExit {
  uint32_t rank = 0;
  int exit_code = 0;    // when term_signal == 0
  int term_signal = 0;  // the signal that killed it, 0 if it exited
  bool clean() const { return exit_code == 0 && term_signal == 0; }
};

// A trainer that outlived SIGKILL (StopAll).
struct Unkillable {
  uint32_t rank = 0;
  pid_t pid = 0;
  char state = '?';  // its state in /proc/PID/stat ('D': uninterruptible)
};

// "exited with code 3" / "exited with signal 9".
std::string DescribeExit(const TrainerExit& e);

// `program` itself if it contains a '/', else the first executable file of
// that name in $PATH; NotFound naming it otherwise.
[[nodiscard]] absl::StatusOr<std::string> ResolveProgram(
    const std::string& program);

class TrainerSet {
 public:
  TrainerSet() = default;
  TrainerSet(const TrainerSet&) = delete;
  TrainerSet& operator=(const TrainerSet&) = delete;
  ~TrainerSet() {
    StopAll(std::chrono::milliseconds(0));
    StopWarm(std::chrono::milliseconds(0));
  }

  // How long StopAll waits for a SIGKILLed trainer to be gone: the exit of
  // a process with tens of GB mapped takes a second or two; ten seconds
  // more is not an exit in progress.
  static constexpr std::chrono::seconds kKillWait{10};

  // Starts `path` (resolved) with `argv` and exactly `env` ("K=V") for
  // `rank`; stdout/stderr are inherited, the signal mask is cleared. A
  // trainer whose exec fails exits with code 127.
  [[nodiscard]] absl::Status Start(uint32_t rank, const std::string& path,
                                   const std::vector<std::string>& argv,
                                   const std::vector<std::string>& env);
  // Trainers that exited since the last call, without blocking. What they
  // left behind in their process group is killed.
  std::vector<TrainerExit> Reap();
  // SIGTERM to every trainer's process group, SIGKILL to those still there
  // after `grace`; returns once all are reaped, or kill_wait after the
  // SIGKILL with those that are not.
  std::vector<Unkillable> StopAll(
      std::chrono::milliseconds grace,
      std::chrono::milliseconds kill_wait = kKillWait);
  // The same for the trainers of `ranks` only (those not running are
  // skipped); the others keep running.
  std::vector<Unkillable> Stop(const std::vector<uint32_t>& ranks,
                               std::chrono::milliseconds grace,
                               std::chrono::milliseconds kill_wait = kKillWait);
  std::vector<uint32_t> RunningRanks() const;

  // Warm processes: trainers started ahead for no rank yet (ckptrun
  // --warm), in their own process group under the guardian like the
  // others. StartWarm starts one and returns its pid; Place makes warm
  // process `pid` the trainer of `rank` (false if it is not a warm process
  // or `rank` runs already); from then on it is a trainer like any other.
  [[nodiscard]] absl::StatusOr<pid_t> StartWarm(
      const std::string& path, const std::vector<std::string>& argv,
      const std::vector<std::string>& env);
  bool Place(pid_t pid, uint32_t rank);
  // Whether warm process `pid` has not exited (a zombie has; nothing is
  // reaped here).
  bool WarmAlive(pid_t pid) const;
  // The warm processes that exited (Reap), since the last call; their
  // TrainerExit's rank means nothing.
  std::vector<std::pair<pid_t, TrainerExit>> TakeWarmExits();
  // Stops every warm process as Stop does.
  void StopWarm(std::chrono::milliseconds grace,
                std::chrono::milliseconds kill_wait = kKillWait);
  // rank -> pid (= process group id) of each running trainer.
  std::map<uint32_t, pid_t> Running() const { return running_; }
  // The guardian's pid (0 before the first Start, or if it could not be
  // started: trainers then rely on PDEATHSIG alone).
  pid_t guardian() const { return guardian_; }

 private:
  // Forks and execs one process in its own group (see Start).
  absl::StatusOr<pid_t> Fork(const std::string& what, const std::string& path,
                             const std::vector<std::string>& argv,
                             const std::vector<std::string>& env);
  // SIGTERM, then SIGKILL after `grace`, to each group of `groups`; those
  // still there kill_wait later (by key).
  std::vector<Unkillable> StopGroups(const std::map<uint32_t, pid_t>& groups,
                                     std::chrono::milliseconds grace,
                                     std::chrono::milliseconds kill_wait);
  // Starts the guardian once; a failure is logged, not fatal.
  void StartGuardian();
  // Tells the guardian that group `pgid` is a trainer's ('+') or gone ('-').
  void TellGuardian(char op, pid_t pgid);

  std::map<uint32_t, pid_t> running_;  // rank -> pid (= process group id)
  std::set<pid_t> warm_;               // warm processes, not placed yet
  std::vector<std::pair<pid_t, TrainerExit>> warm_exits_;
  pid_t guardian_ = 0;
  int guardian_fd_ = -1;  // the write end of the guardian's pipe
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CKPTRUN_TRAINERS_H_
