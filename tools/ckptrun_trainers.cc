#include "tools/ckptrun_trainers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

TrainerExit FromWaitStatus(uint32_t rank, int status) {
  TrainerExit e;
  e.rank = rank;
  if (WIFSIGNALED(status))
    e.term_signal = WTERMSIG(status);
  else
    e.exit_code = WEXITSTATUS(status);
  return e;
}

// The state letter of /proc/PID/stat ("R", "S", "D", "Z", ...), '?' when
// it cannot be read.
char ProcessState(pid_t pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (!f) return '?';
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) S ...": comm may hold spaces and parentheses; the state
  // follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && close[2] ? close[2] : '?';
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings)
    out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

constexpr size_t kRecord = 1 + sizeof(int32_t);  // op, pgid
constexpr int kMaxGroups = 4096;

// The guardian (see the header), forked from a process with threads: only
// async-signal-safe calls from here on. `fd` is its end of a SOCK_SEQPACKET
// pair: one record per message, and a read of 0 once ckptrun is gone.
[[noreturn]] void GuardianLoop(int fd) {
  pid_t groups[kMaxGroups];
  int n = 0;
  for (;;) {
    char rec[kRecord];
    ssize_t r = recv(fd, rec, sizeof rec, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;  // ckptrun died (or exited): its trainers go with it
    if (r != static_cast<ssize_t>(kRecord)) continue;
    int32_t pgid;
    std::memcpy(&pgid, rec + 1, sizeof pgid);
    if (rec[0] == '+' && n < kMaxGroups) {
      groups[n++] = pgid;
    } else if (rec[0] == '-') {
      for (int i = 0; i < n; ++i)
        if (groups[i] == pgid) groups[i--] = groups[--n];
    }
  }
  for (int i = 0; i < n; ++i) kill(-groups[i], SIGKILL);
  _exit(0);
}

}  // namespace

void TrainerSet::StartGuardian() {
  // Orphans of a trainer's wrapper come to ckptrun (Reap), not to init.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    std::fprintf(stderr, "ckptrun: no trainer guardian (socketpair: %s)\n",
                 std::strerror(errno));
    return;
  }
  pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "ckptrun: no trainer guardian (fork: %s)\n",
                 std::strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return;
  }
  if (pid == 0) {
    setpgid(0, 0);  // no terminal signal, no trainer group kill reaches it
    struct sigaction ign = {};
    ign.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE})
      sigaction(sig, &ign, nullptr);
    // Keep no copy of ckptrun's sockets (its coordinator connections
    // would outlive their closing here): only its end of the pair.
    int fd = fds[0] == 3 ? 3 : dup2(fds[0], 3);
    if (fd != 3) _exit(1);
    close_range(4, ~0U, 0);
    for (int std_fd = 0; std_fd < 3; ++std_fd)
      close(std_fd);  // nor a log pipe's end
    GuardianLoop(3);
  }
  close(fds[0]);
  guardian_ = pid;
  guardian_fd_ = fds[1];
}

void TrainerSet::TellGuardian(char op, pid_t pgid) {
  if (guardian_fd_ < 0) return;
  char rec[kRecord];
  rec[0] = op;
  int32_t v = pgid;
  std::memcpy(rec + 1, &v, sizeof v);
  // MSG_NOSIGNAL: a dead guardian must not take ckptrun with it (SIGPIPE).
  while (send(guardian_fd_, rec, sizeof rec, MSG_NOSIGNAL) < 0 &&
         errno == EINTR) {
  }
}

std::string DescribeExit(const TrainerExit& e) {
  return e.term_signal != 0 ? absl::StrCat("exited with signal ", e.term_signal)
                            : absl::StrCat("exited with code ", e.exit_code);
}

absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  if (program.empty())
    return absl::InvalidArgumentError("CMD: empty program name");
  if (program.find('/') != std::string::npos) {
    if (IsExecutableFile(program)) return program;
    return absl::NotFoundError(
        absl::StrCat("CMD: ", program, " is not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("CMD: ", program, " not found in $PATH"));
}

absl::StatusOr<pid_t> TrainerSet::Fork(const std::string& what,
                                       const std::string& path,
                                       const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env) {
  // Everything the child touches is built before fork: between fork and
  // exec only async-signal-safe calls (gRPC's threads may hold locks).
  std::vector<char*> c_argv = CStrings(argv);
  std::vector<char*> c_env = CStrings(env);
  if (guardian_ == 0) StartGuardian();
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, absl::StrCat("fork for ", what));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // ckptrun died before PDEATHSIG was set
    // Yama (ptrace_scope 1) lets only ancestors trace: ckptrun and its
    // children (the stack tools of a hang, stack_capture.h) may trace this
    // trainer. EINVAL without Yama; nothing to do then.
    prctl(PR_SET_PTRACER, parent, 0, 0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    execve(path.c_str(), c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid,
          pid);  // also here, so a StopAll right after Start hits the group
  TellGuardian('+', pid);
  return pid;
}

absl::Status TrainerSet::Start(uint32_t rank, const std::string& path,
                               const std::vector<std::string>& argv,
                               const std::vector<std::string>& env) {
  absl::StatusOr<pid_t> pid =
      Fork(absl::StrCat("rank ", rank), path, argv, env);
  if (!pid.ok()) return pid.status();
  running_[rank] = *pid;
  return absl::OkStatus();
}

absl::StatusOr<pid_t> TrainerSet::StartWarm(
    const std::string& path, const std::vector<std::string>& argv,
    const std::vector<std::string>& env) {
  absl::StatusOr<pid_t> pid = Fork("a warm process", path, argv, env);
  if (pid.ok()) warm_.insert(*pid);
  return pid;
}

bool TrainerSet::Place(pid_t pid, uint32_t rank) {
  if (warm_.count(pid) == 0 || running_.count(rank) != 0) return false;
  warm_.erase(pid);
  running_[rank] = pid;
  return true;
}

bool TrainerSet::WarmAlive(pid_t pid) const {
  if (warm_.count(pid) == 0) return false;
  siginfo_t info = {};
  // WNOWAIT: only looks; Reap still collects it.
  if (waitid(P_PID, static_cast<id_t>(pid), &info,
             WEXITED | WNOHANG | WNOWAIT) != 0)
    return false;
  return info.si_pid == 0;
}

std::vector<std::pair<pid_t, TrainerExit>> TrainerSet::TakeWarmExits() {
  return std::exchange(warm_exits_, {});
}

std::vector<TrainerExit> TrainerSet::Reap() {
  std::vector<TrainerExit> exits;
  // Every child: trainers, the guardian, and descendants their wrappers
  // left behind (reparented to ckptrun, the subreaper).
  for (;;) {
    int status = 0;
    pid_t r = waitpid(-1, &status, WNOHANG);
    if (r <= 0) break;
    if (r == guardian_) {
      std::fprintf(
          stderr,
          "ckptrun: the trainer guardian (pid %d) died; starting another\n", r);
      close(guardian_fd_);
      guardian_fd_ = -1;
      guardian_ = 0;
      StartGuardian();
      for (const auto& [rank, pid] : running_) TellGuardian('+', pid);
      for (pid_t pid : warm_) TellGuardian('+', pid);
      continue;
    }
    if (warm_.erase(r) != 0) {
      kill(-r, SIGKILL);
      TellGuardian('-', r);
      warm_exits_.emplace_back(r, FromWaitStatus(0, status));
      continue;
    }
    for (auto it = running_.begin(); it != running_.end(); ++it) {
      if (it->second != r) continue;
      kill(-r, SIGKILL);  // whatever the trainer forked and left behind
      TellGuardian('-', r);
      exits.push_back(FromWaitStatus(it->first, status));
      running_.erase(it);
      break;
    }
  }
  return exits;
}

std::vector<Unkillable> TrainerSet::StopAll(
    std::chrono::milliseconds grace, std::chrono::milliseconds kill_wait) {
  return Stop(RunningRanks(), grace, kill_wait);
}

std::vector<Unkillable> TrainerSet::Stop(const std::vector<uint32_t>& ranks,
                                         std::chrono::milliseconds grace,
                                         std::chrono::milliseconds kill_wait) {
  std::map<uint32_t, pid_t> stopping;
  for (uint32_t rank : ranks)
    if (auto it = running_.find(rank); it != running_.end())
      stopping.insert(*it);
  std::vector<Unkillable> stuck = StopGroups(stopping, grace, kill_wait);
  for (const auto& [rank, pid] : stopping) running_.erase(rank);
  return stuck;
}

void TrainerSet::StopWarm(std::chrono::milliseconds grace,
                          std::chrono::milliseconds kill_wait) {
  std::map<uint32_t, pid_t> stopping;
  uint32_t key = 0;
  for (pid_t pid : warm_) stopping[key++] = pid;
  for (const Unkillable& u : StopGroups(stopping, grace, kill_wait))
    std::fprintf(stderr,
                 "ckptrun: warm process %d outlived SIGKILL (state %c)\n",
                 u.pid, u.state);
  warm_.clear();
}

std::vector<Unkillable> TrainerSet::StopGroups(
    const std::map<uint32_t, pid_t>& stopping, std::chrono::milliseconds grace,
    std::chrono::milliseconds kill_wait) {
  if (stopping.empty()) return {};
  std::map<uint32_t, pid_t> left = stopping;
  // Reaps what exits until `until` or nothing is left.
  auto reap_until = [&left](std::chrono::steady_clock::time_point until) {
    for (;;) {
      for (auto it = left.begin(); it != left.end();)
        it = waitpid(it->second, nullptr, WNOHANG) == it->second
                 ? left.erase(it)
                 : std::next(it);
      if (left.empty() || std::chrono::steady_clock::now() >= until) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  for (const auto& [rank, pid] : stopping) kill(-pid, SIGTERM);
  reap_until(std::chrono::steady_clock::now() + grace);
  for (const auto& [rank, pid] : stopping)
    kill(-pid, SIGKILL);  // stragglers in each group too
  reap_until(std::chrono::steady_clock::now() + kill_wait);
  std::vector<Unkillable> stuck;
  for (const auto& [rank, pid] : left)
    stuck.push_back({rank, pid, ProcessState(pid)});
  for (const auto& [rank, pid] : stopping) TellGuardian('-', pid);
  return stuck;
}

std::vector<uint32_t> TrainerSet::RunningRanks() const {
  std::vector<uint32_t> ranks;
  for (const auto& [rank, pid] : running_) ranks.push_back(rank);
  return ranks;
}

}  // namespace ckpt::tools
