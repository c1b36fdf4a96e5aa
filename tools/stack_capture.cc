#include "tools/stack_capture.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::tools {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first executable `name` in $PATH, or "".
std::string FindTool(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/local/bin:/usr/bin:/bin", ':',
                      absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs argv with stdout and stderr into a pipe; its output, at most
// max_bytes, killed (and said so) at the deadline.
std::string Run(const std::vector<std::string>& argv,
                std::chrono::milliseconds timeout, size_t max_bytes) {
  std::vector<char*> c_argv;
  for (const std::string& a : argv)
    c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    return absl::StrCat("(pipe: ", std::strerror(errno), ")\n");
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return absl::StrCat("(fork: ", std::strerror(errno), ")\n");
  }
  if (pid == 0) {
    // ckptrun blocks its signals (SIGCHLD among them) in every thread;
    // a debugger needs them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::execv(c_argv[0], c_argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  const auto deadline = Clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd p = {fds[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[8192];
    ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (out.size() < max_bytes)
      out.append(buf, std::min<size_t>(got, max_bytes - out.size()));
  }
  ::close(fds[0]);
  if (timed_out) {
    ::kill(pid, SIGKILL);
    absl::StrAppend(&out, "\n(", argv[0], " killed after ", timeout.count(),
                    " ms)\n");
  }
  ::waitpid(pid, nullptr, 0);
  return out;
}

std::string Comm(pid_t pid) {
  std::string c = ReadFile(absl::StrCat("/proc/", pid, "/comm"));
  while (!c.empty() && c.back() == '\n') c.pop_back();
  return c;
}

}  // namespace

std::vector<pid_t> ProcessGroup(pid_t pgid) {
  std::vector<pid_t> out{pgid};
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  while (struct dirent* e = ::readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid) || pid == pgid) continue;
    // /proc/PID/stat: "pid (comm) state ppid pgrp ..."; comm may hold
    // spaces and parentheses, so parse from the last ')'.
    std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> f =
        absl::StrSplit(stat.substr(close + 2), ' ', absl::SkipEmpty());
    int group = 0;
    if (f.size() > 2 && absl::SimpleAtoi(f[2], &group) && group == pgid)
      out.push_back(pid);
  }
  ::closedir(proc);
  return out;
}

bool CatchesSignal(pid_t pid, int sig) {
  std::string status = ReadFile(absl::StrCat("/proc/", pid, "/status"));
  for (absl::string_view line : absl::StrSplit(status, '\n')) {
    if (!absl::ConsumePrefix(&line, "SigCgt:")) continue;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line), &mask))
      return false;
    return (mask >> (sig - 1)) & 1;
  }
  return false;
}

CapturedStacks CaptureStacks(uint32_t rank, pid_t pgid,
                             const CaptureOptions& options) {
  CapturedStacks out;
  out.rank = rank;
  out.pid = pgid;
  const std::string eu_stack = FindTool("eu-stack");
  const std::string gdb = eu_stack.empty() ? FindTool("gdb") : "";
  bool python = false;
  std::vector<pid_t> group = ProcessGroup(pgid);
  // Python first: the dump needs the process running (a native tool
  // stops it while it reads).
  if (!options.py_file.empty()) {
    std::vector<pid_t> asked;
    if (::truncate(options.py_file.c_str(), 0) == 0)
      for (pid_t pid : group)
        if (CatchesSignal(pid, SIGUSR2) && ::kill(pid, SIGUSR2) == 0)
          asked.push_back(pid);
    if (!asked.empty()) {
      // The dump is written from the signal handler: wait until the file
      // stops growing.
      const auto deadline = Clock::now() + options.python_wait;
      size_t last = 0;
      while (Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        struct stat st {};
        size_t size = ::stat(options.py_file.c_str(), &st) == 0
                          ? static_cast<size_t>(st.st_size)
                          : 0;
        if (size > 0 && size == last) break;
        last = size;
      }
      std::string dump = ReadFile(options.py_file);
      if (!dump.empty()) {
        python = true;
        absl::StrAppend(&out.text, "== Python stacks (faulthandler) ==\n", dump,
                        "\n");
      }
    }
  }
  for (pid_t pid : group) {
    if (out.text.size() >= options.max_bytes) break;
    absl::StrAppend(&out.text, "== pid ", pid, " (", Comm(pid), ") ==\n");
    if (!eu_stack.empty())
      out.text += Run({eu_stack, "-p", std::to_string(pid)}, options.timeout,
                      options.max_bytes);
    else if (!gdb.empty())
      out.text += Run({gdb, "-batch", "-nx", "-p", std::to_string(pid), "-ex",
                       "thread apply all bt"},
                      options.timeout, options.max_bytes);
    else
      out.text += "(no eu-stack or gdb in $PATH: no native stacks)\n";
  }
  if (out.text.size() > options.max_bytes) out.text.resize(options.max_bytes);
  out.tool =
      absl::StrCat(python ? "faulthandler+" : "", !eu_stack.empty() ? "eu-stack"
                                                  : !gdb.empty()    ? "gdb"
                                                                    : "none");
  return out;
}

}  // namespace ckpt::tools
