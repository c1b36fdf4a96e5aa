#include "tools/ckptrun_trainers.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

TrainerExit FromWaitStatus(uint32_t rank, int status) {
  TrainerExit e;
  e.rank = rank;
  if (WIFSIGNALED(status)) e.term_signal = WTERMSIG(status);
  else e.exit_code = WEXITSTATUS(status);
  return e;
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string DescribeExit(const TrainerExit& e) {
  return e.term_signal != 0 ? absl::StrCat("exited with signal ", e.term_signal)
                            : absl::StrCat("exited with code ", e.exit_code);
}

absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  if (program.empty()) return absl::InvalidArgumentError("CMD: empty program name");
  if (program.find('/') != std::string::npos) {
    if (IsExecutableFile(program)) return program;
    return absl::NotFoundError(absl::StrCat("CMD: ", program, " is not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("CMD: ", program, " not found in $PATH"));
}

absl::Status TrainerSet::Start(uint32_t rank, const std::string& path, const std::vector<std::string>& argv,
                               const std::vector<std::string>& env) {
  // Everything the child touches is built before fork: between fork and
  // exec only async-signal-safe calls (gRPC's threads may hold locks).
  std::vector<char*> c_argv = CStrings(argv);
  std::vector<char*> c_env = CStrings(env);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return ErrnoToStatus(errno, absl::StrCat("fork for rank ", rank));
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // ckptrun died before PDEATHSIG was set
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    execve(path.c_str(), c_argv.data(), c_env.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a StopAll right after Start hits the group
  running_[rank] = pid;
  return absl::OkStatus();
}

std::vector<TrainerExit> TrainerSet::Reap() {
  std::vector<TrainerExit> exits;
  for (auto it = running_.begin(); it != running_.end();) {
    int status = 0;
    pid_t r = waitpid(it->second, &status, WNOHANG);
    if (r == it->second) {
      kill(-it->second, SIGKILL);  // whatever the trainer forked and left behind
      exits.push_back(FromWaitStatus(it->first, status));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return exits;
}

void TrainerSet::StopAll(std::chrono::milliseconds grace) {
  if (running_.empty()) return;
  for (const auto& [rank, pid] : running_) kill(-pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::map<uint32_t, pid_t> left = running_;
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    for (auto it = left.begin(); it != left.end();)
      it = waitpid(it->second, nullptr, WNOHANG) == it->second ? left.erase(it) : std::next(it);
    if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (const auto& [rank, pid] : running_) kill(-pid, SIGKILL);  // stragglers in each group too
  for (const auto& [rank, pid] : left) waitpid(pid, nullptr, 0);
  running_.clear();
}

std::vector<uint32_t> TrainerSet::RunningRanks() const {
  std::vector<uint32_t> ranks;
  for (const auto& [rank, pid] : running_) ranks.push_back(rank);
  return ranks;
}

}  // namespace ckpt::tools
