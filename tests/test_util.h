// Small helpers every process-level test needs: a free loopback port, a
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
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::testing {

// A loopback TCP port that was free a moment ago (the kernel's pick for
// port 0); 0 if none could be had.
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// `n` distinct free loopback ports. Each probe socket stays bound until
// all are picked: FreeLoopbackPort twice in a row may return the same port,
// and two gRPC servers (SO_REUSEPORT) then share it, each getting some of
// the other's connections.
inline std::vector<int> FreeLoopbackPorts(int n) {
  std::vector<int> fds, ports;
  for (int i = 0; i < n; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      break;
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  ports.resize(n, 0);
  return ports;
}

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
