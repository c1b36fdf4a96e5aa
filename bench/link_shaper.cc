#include "bench/link_shaper.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::bench {
namespace {

// A handle no other tool picks by chance: a leftover with it is ours.
constexpr const char* kHandle = "7c4b:";
constexpr const char* kMarker = "/run/ckpt-recovery-bench-tc.pid";

// Runs tc with `args` (no shell); its exit status and output together.
struct TcResult {
  int status = -1;
  std::string out;
};
TcResult Tc(const std::vector<std::string>& args) {
  TcResult r;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> argv;
    static char tc[] = "tc";
    argv.push_back(tc);
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp("tc", argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int ws = 0;
  if (pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws))
    r.status = WEXITSTATUS(ws);
  return r;
}

void RemoveQdisc() {
  (void)Tc({"qdisc", "del", "dev", "lo", "root", "handle", kHandle});
  std::remove(kMarker);
}

LinkShaper* g_active = nullptr;

void OnExit() {
  if (g_active != nullptr) g_active->Stop();
}

void OnSignal(int sig) {
  if (g_active != nullptr) g_active->Stop();
  signal(sig, SIG_DFL);
  raise(sig);
}

// Whether the pid in the marker file is a live process other than us.
bool MarkerOwnerAlive() {
  std::ifstream in(kMarker);
  long pid = 0;
  if (!(in >> pid) || pid <= 0 || pid == getpid()) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

absl::StatusOr<int> FreePortBlock(int want) {
  if (want != 0 && (want % 16 != 0 || want < 1024 || want > 65520))
    return absl::InvalidArgumentError(absl::StrCat(
        "--port-base: ", want, " is not a multiple of 16 in [1024, 65520]"));
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int base =
        want != 0
            ? want
            : 20000 + 16 * static_cast<int>(rng() % ((32768 - 20000) / 16));
    bool free = true;
    for (int p = base; free && p < base + 16; ++p) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(p));
      free =
          fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      if (fd >= 0) close(fd);
    }
    if (free) return base;
    if (want != 0)
      return absl::UnavailableError(absl::StrCat(
          "--port-base: a port of [", want, ", ", want + 16, ") is in use"));
  }
  return absl::UnavailableError("no free block of 16 loopback ports");
}

absl::Status LinkShaper::Start(int port_base, double gbit) {
  if (active_) return absl::FailedPreconditionError("already shaping");
  if (port_base % 16 != 0 || port_base < 1024 || port_base > 65520)
    return absl::InvalidArgumentError(
        absl::StrCat("port_base: ", port_base, " is not 16-aligned"));
  if (!(gbit >= 0.01 && gbit <= 400))
    return absl::InvalidArgumentError(
        absl::StrCat("--link-gbit: ", gbit, " is not in [0.01, 400]"));
  if (geteuid() != 0)
    return absl::FailedPreconditionError(
        "not root: tc needs CAP_NET_ADMIN to shape lo");
  TcResult show = Tc({"qdisc", "show", "dev", "lo"});
  if (show.status == 127)
    return absl::FailedPreconditionError("tc (iproute2) is not installed");
  if (show.status != 0)
    return absl::FailedPreconditionError("tc qdisc show dev lo: " + show.out);
  if (show.out.find(std::string("qdisc htb ") + kHandle + " root") !=
      std::string::npos) {
    if (MarkerOwnerAlive())
      return absl::FailedPreconditionError(
          "another recovery_bench is shaping lo now (" + std::string(kMarker) +
          ")");
    RemoveQdisc();  // left by a bench that was killed
    show = Tc({"qdisc", "show", "dev", "lo"});
  }
  // Never replace someone else's qdisc: lo's default is noqueue.
  if (show.out.find("root") != std::string::npos &&
      show.out.find("qdisc noqueue") == std::string::npos)
    return absl::FailedPreconditionError(
        "lo already has a root qdisc that is not ours: " + show.out);
  // HTB (this VM's kernel has no prio qdisc): traffic no filter matches is
  // sent directly, unshaped (no default class); the filters' go to one
  // class at the rate.
  const std::string rate = absl::StrFormat("%.0fmbit", gbit * 1000);
  // A burst well above one 64 KiB GSO packet and ~1 ms at the rate.
  const uint64_t burst = std::max<uint64_t>(
      256 << 10, static_cast<uint64_t>(gbit * 1e9 / 8 / 1000));
  std::vector<std::vector<std::string>> steps = {
      {"qdisc", "add", "dev", "lo", "root", "handle", kHandle, "htb"},
      {"class", "add", "dev", "lo", "parent", kHandle, "classid", "7c4b:1",
       "htb", "rate", rate, "ceil", rate, "burst", std::to_string(burst),
       "cburst", std::to_string(burst), "quantum", "200000"},
  };
  const std::string mask = "0xfff0";
  for (const char* dir : {"sport", "dport"})
    steps.push_back({"filter", "add", "dev", "lo", "parent", kHandle,
                     "protocol", "ip", "prio", "1", "u32", "match", "ip", dir,
                     std::to_string(port_base), mask, "flowid", "7c4b:1"});
  {
    std::ofstream marker(kMarker, std::ios::trunc);
    marker << getpid() << "\n";
  }
  for (const auto& s : steps) {
    TcResult r = Tc(s);
    if (r.status != 0) {
      RemoveQdisc();
      std::string cmd = "tc";
      for (const auto& a : s) absl::StrAppend(&cmd, " ", a);
      return absl::FailedPreconditionError(
          absl::StrCat(cmd, ": exit ", r.status, ": ", r.out));
    }
  }
  active_ = true;
  if (g_active == nullptr) {
    g_active = this;
    std::atexit(OnExit);
    signal(SIGINT, OnSignal);
    signal(SIGTERM, OnSignal);
  }
  return absl::OkStatus();
}

LinkShaper::~LinkShaper() {
  Stop();
  if (g_active == this) g_active = nullptr;
}

void LinkShaper::Stop() {
  if (!active_) return;
  active_ = false;
  RemoveQdisc();
}

}  // namespace ckpt::bench
