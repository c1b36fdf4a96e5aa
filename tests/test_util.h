// Small helpers every process-level test needs: free TCP ports, a
// shell command's exit code and output, a file's bytes. Header-only, no
// state; each call is independent (thread-safe as the C calls it makes).
#ifndef CKPT_TESTS_TEST_UTIL_H_
#define CKPT_TESTS_TEST_UTIL_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::testing {

// Test ports come from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default): a port the
// kernel picks for bind(0) is in that range, and between the pick and the
// server's own bind any outgoing connection of another test (a gRPC client,
// an HTTP probe) may take it as its local port; below the range only an
// explicit bind can. The lower bound of the range, or 0 if unreadable.
inline int EphemeralPortsStart() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (!(f >> lo >> hi)) return 0;
  return lo;
}

// `n` distinct TCP ports that were free on every address a moment ago,
// drawn at random from [10000, the ephemeral range) (the kernel's pick
// where that range starts too low to leave room); 0 for a port that could
// not be had. Each probe socket stays bound until all are picked, so the
// ports differ (two gRPC servers on one port, with SO_REUSEPORT, would
// each get some of the other's connections).
inline std::vector<int> FreeLoopbackPorts(int n) {
  constexpr int kLowest = 10000;
  const int end = EphemeralPortsStart();
  std::mt19937 rng(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int port = 0;
    for (int attempt = 0; attempt < 200 && port == 0; ++attempt) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) break;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      const bool pick = end >= kLowest + 1000;
      if (pick)
        a.sin_port = htons(static_cast<uint16_t>(
            std::uniform_int_distribution<int>(kLowest, end - 1)(rng)));
      socklen_t len = sizeof a;
      if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
          getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
        fds.push_back(fd);
      } else {
        close(fd);
        if (!pick) break;
      }
    }
    ports.push_back(port);
  }
  for (int fd : fds) close(fd);
  return ports;
}

// One such port.
inline int FreeLoopbackPort() { return FreeLoopbackPorts(1)[0]; }

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout, or stdout and stderr together
};

// Runs `command` through /bin/sh; with_stderr folds stderr into out (else
// it is discarded); timeout_s > 0 bounds it with coreutils' timeout.
inline CommandResult RunCommand(const std::string& command,
                                bool with_stderr = true, int timeout_s = 0) {
  CommandResult r;
  std::string cmd =
      (timeout_s > 0 ? "timeout " + std::to_string(timeout_s) + " " : "") +
      command + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The whole file ("" if it cannot be read).
inline std::string ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_UTIL_H_
