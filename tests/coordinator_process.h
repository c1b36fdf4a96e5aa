// Test helper: the real ckpt-coordinator binary (COORDINATOR_BINARY, a
// compile definition of the test target, unless another is given) on 127.0.0.1,
// with the port it picked read from its first stdout line. Used by the
// coordinator's e2e test the tools' tests (ckptrun_test, ctl_coord_test) and
// coord_scale_bench. The child gets SIGKILL when the test process dies; the
// destructor SIGKILLs and reaps it. Header-only; not thread-safe.
#ifndef CKPT_TESTS_COORDINATOR_PROCESS_H_
#define CKPT_TESTS_COORDINATOR_PROCESS_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "coordinator.grpc.pb.h"

#ifndef COORDINATOR_BINARY
#error \
    "tests/coordinator_process.h needs COORDINATOR_BINARY defined by the test target"
#endif

namespace ckpt::testing {

class CoordinatorProcess {
 public:
  // Forks and execs at once, which is safe after this process used gRPC.
  // port 0: the binary picks one. own_session: the coordinator is a
  // session of its own (setsid), so that the kernel's autogroup schedules
  // it apart from this process and its other children (coord_scale_bench:
  // the coordinator and the simulators get equal CPU shares).
  CoordinatorProcess(const std::string& state, const std::string& shared,
                     int heartbeat_timeout_ms, int port = 0,
                     const std::string& binary = COORDINATOR_BINARY,
                     bool own_session = false) {
    std::string listen = "127.0.0.1:" + std::to_string(port);
    int fds[2];
    if (pipe(fds) != 0) return;
    std::string timeout = std::to_string(heartbeat_timeout_ms);
    pid_ = fork();
    if (pid_ == 0) {
      if (own_session) setsid();
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      dup2(fds[1], 1);
      close(fds[0]);
      execl(binary.c_str(), binary.c_str(), "--listen", listen.c_str(),
            "--state", state.c_str(), "--shared-root", shared.c_str(),
            "--heartbeat-timeout-ms", timeout.c_str(), "--insecure", nullptr);
      _exit(127);
    }
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    char line[256] = {};
    // The first "listening on HOST:PORT" line; a read interrupted by a
    // signal is read again.
    while (out != nullptr) {
      if (std::fgets(line, sizeof line, out) == nullptr) {
        if (!std::ferror(out) || errno != EINTR) break;
        std::clearerr(out);
        continue;
      }
      if (std::strncmp(line, "listening on ", 13) != 0) continue;
      const char* colon = std::strrchr(line, ':');
      if (colon) port_ = std::atoi(colon + 1);
      break;
    }
    if (out) std::fclose(out);
  }
  ~CoordinatorProcess() { Kill(); }
  CoordinatorProcess(const CoordinatorProcess&) = delete;
  CoordinatorProcess& operator=(const CoordinatorProcess&) = delete;

  // Sends `sig` and reaps the process.
  void Kill(int sig = SIGKILL) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::unique_ptr<::ckpt::coord::v1::Coordinator::Stub> Stub() const {
    return ::ckpt::coord::v1::Coordinator::NewStub(
        grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_COORDINATOR_PROCESS_H_
