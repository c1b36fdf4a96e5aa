// The test plays systemd: it binds a NOTIFY_SOCKET datagram socket, starts
// the real ckptd / ckpt-coordinator / ckpt-relay binaries with NOTIFY_SOCKET
// and WATCHDOG_USEC in their environment, and reads what they announce
// (sd_notify(3): READY=1, STATUS=, WATCHDOG=1, STOPPING=1).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "coordinator.grpc.pb.h"
#include "tests/harness.h"
#include "util/service_notify.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The service manager's end: one datagram per sd_notify call.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    bound_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~NotifySocket() { close(fd_); }
  bool bound() const { return bound_; }
  const std::string& path() const { return path_; }

  // The next datagram, or nullopt after `timeout`.
  std::optional<std::string> Recv(Clock::duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    int ms = static_cast<int>(
        std::chrono::duration_cast<milliseconds>(timeout).count());
    if (poll(&p, 1, std::max(ms, 0)) != 1) return std::nullopt;
    char buf[4096];
    ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }
  // Reads until a datagram containing `what`; the ones before go to *before.
  std::optional<std::string> WaitFor(
      const std::string& what, Clock::duration timeout,
      std::vector<std::string>* before = nullptr) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      auto m = Recv(deadline - Clock::now());
      if (!m) break;
      if (m->find(what) != std::string::npos) return m;
      if (before) before->push_back(*m);
    }
    return std::nullopt;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// A child process with extra environment variables; stdout on a pipe.
// soft_nofile > 0: it starts with that soft limit on open descriptors (as
// systemd starts a unit with 1024).
class Child {
 public:
  Child(std::vector<std::string> args, std::vector<std::string> env,
        rlim_t soft_nofile = 0) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (rlimit lim{};
          soft_nofile > 0 && getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        lim.rlim_cur = soft_nofile;
        setrlimit(RLIMIT_NOFILE, &lim);
      }
      dup2(fds[1], 1);
      for (auto& e : env) putenv(e.data());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (out_) fclose(out_);
  }
  std::string ReadLine() {
    char line[512] = {};
    return out_ && std::fgets(line, sizeof line, out_) ? line : "";
  }
  void Signal(int sig) { kill(pid_, sig); }
  pid_t pid() const { return pid_; }
  // Its soft and hard limits on open descriptors (/proc/PID/limits).
  std::pair<std::string, std::string> DescriptorLimits() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/limits");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("Max open files", 0) == 0) {
        std::istringstream f(line.substr(std::strlen("Max open files")));
        std::string soft, hard;
        f >> soft >> hard;
        return {soft, hard};
      }
    return {"", ""};
  }
  int Wait() {
    int status = -1;
    if (pid_ > 0) waitpid(pid_, &status, 0);
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

bool Connects(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

class SystemdNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef CKPT_HAVE_SYSTEMD
    GTEST_SKIP()
        << "built without libsystemd: the binaries send no notifications";
#endif
  }
  void TearDown() override { UnlinkArenas(prefix_); }

  std::unique_ptr<Child> StartDaemon(int watchdog_ms,
                                     std::vector<std::string> extra_env = {}) {
    std::vector<std::string> env = {
        "NOTIFY_SOCKET=" + notify_.path(),
        "WATCHDOG_USEC=" + std::to_string(watchdog_ms * 1000)};
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    return std::make_unique<Child>(
        std::vector<std::string>{CKPTD_BINARY, "--socket", socket_, "--root",
                                 dir_.path() + "/root", "--shm-prefix", prefix_,
                                 "--drain-seconds", "1"},
        env);
  }
  // Waits for n WATCHDOG=1 pings; returns when each arrived.
  std::vector<Clock::time_point> Pings(int n, Clock::duration timeout) {
    std::vector<Clock::time_point> at;
    while (static_cast<int>(at.size()) < n &&
           notify_.WaitFor("WATCHDOG=1", timeout))
      at.push_back(Clock::now());
    return at;
  }
  // n pings whose mean period is under the watchdog timeout and not far
  // below it (half of it is what sd_watchdog_enabled(3) suggests).
  void ExpectPingsUnder(int n, int watchdog_ms) {
    auto at = Pings(n, std::chrono::seconds(10));
    ASSERT_EQ(at.size(), static_cast<size_t>(n));
    auto mean = (at.back() - at.front()) / (n - 1);
    EXPECT_LT(mean, std::chrono::milliseconds(watchdog_ms));
    EXPECT_GT(mean, std::chrono::milliseconds(watchdog_ms / 8));
  }
  // GetCluster on the port `child` printed ("... HOST:PORT") before it
  // said READY=1.
  static grpc::Status GetClusterOnPrintedPort(Child& child) {
    std::string line = child.ReadLine();
    auto colon = line.rfind(':');
    if (colon == std::string::npos)
      return grpc::Status(grpc::StatusCode::INTERNAL, "no port in " + line);
    auto stub = coord::v1::Coordinator::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(std::atoi(line.c_str() + colon + 1)),
        grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    coord::v1::GetClusterRequest req;
    coord::v1::GetClusterResponse resp;
    return stub->GetCluster(&ctx, req, &resp);
  }
  // SIGTERM: STOPPING=1, then exit 0.
  void ExpectStopsOnSigterm(Child& child) {
    child.Signal(SIGTERM);
    ASSERT_TRUE(
        notify_.WaitFor("STOPPING=1", std::chrono::seconds(10)).has_value());
    int status = child.Wait();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }

  TempDir dir_;
  std::string socket_ = dir_.path() + "/ckptd.sock";
  std::string prefix_ = UniqueShmPrefix();
  NotifySocket notify_{dir_.path() + "/notify"};
};

TEST_F(SystemdNotifyTest,
       DaemonSaysReadyOnlyOnceItsSocketAcceptsThenPingsAtHalfTheTimeout) {
  ASSERT_TRUE(notify_.bound());
  constexpr int kWatchdogMs = 800;
  auto daemon = StartDaemon(kWatchdogMs);
  std::vector<std::string> before;
  auto ready = notify_.WaitFor("READY=1", std::chrono::seconds(30), &before);
  ASSERT_TRUE(ready.has_value()) << "no READY=1 from ckptd";
  // At the moment READY=1 arrives the socket must already serve requests.
  ASSERT_TRUE(Connects(socket_));
  auto stub = v1::Ckptd::NewStub(grpc::CreateChannel(
      "unix:" + socket_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::StatusRequest req;
  v1::StatusResponse resp;
  EXPECT_TRUE(stub->Status(&ctx, req, &resp).ok());
  ASSERT_FALSE(before.empty());
  EXPECT_NE(before.front().find("STATUS=re-attaching"), std::string::npos)
      << before.front();
  EXPECT_NE(ready->find("STATUS=serving; 0 persists queued"), std::string::npos)
      << *ready;

  // Pings every half timeout: systemd needs at least one per timeout, and
  // the daemon must not flood the manager either (loose bounds).
  auto at = Pings(5, std::chrono::seconds(10));
  ASSERT_EQ(at.size(), 5u);
  auto mean = (at.back() - at.front()) / 4;
  EXPECT_LT(mean, milliseconds(kWatchdogMs));
  EXPECT_GT(mean, milliseconds(kWatchdogMs / 8));

  daemon->Signal(SIGTERM);
  auto stopping = notify_.WaitFor("STOPPING=1", std::chrono::seconds(10));
  ASSERT_TRUE(stopping.has_value());
  EXPECT_NE(stopping->find("STATUS=draining"), std::string::npos) << *stopping;
  int status = daemon->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(SystemdNotifyTest, DaemonWhoseSocketIsTakenNeverSaysReady) {
  ASSERT_TRUE(notify_.bound());
  // Someone else serves the socket path: ckptd must fail, not claim READY.
  int other = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(other, 4), 0);
  auto daemon = StartDaemon(800);
  int status = daemon->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::vector<std::string> got;
  EXPECT_FALSE(notify_.WaitFor("READY=1", milliseconds(200), &got).has_value());
  close(other);
}

TEST_F(SystemdNotifyTest, WatchdogPingsStopWhileThePersisterIsWedged) {
  ASSERT_TRUE(notify_.bound());
  constexpr int kWatchdogMs = 1000;
  auto daemon =
      StartDaemon(kWatchdogMs, {"CKPTD_TEST_FAULT=hang-persist-writes"});
  ASSERT_TRUE(notify_.WaitFor("READY=1", std::chrono::seconds(30)).has_value());
  // Idle: nothing to persist, so a hanging disk is no reason to stop.
  ASSERT_EQ(Pings(2, std::chrono::seconds(5)).size(), 2u);

  ClientOptions o;
  o.socket_path = socket_;
  o.job = "wedged";
  o.rank = 0;
  o.world_size = 1;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  HostState state = MakeState(1 << 20, 2, 7);
  ASSERT_TRUE(
      (*client)->Save(1, state.tensors).ok());  // staged; its persist hangs

  auto stuck = notify_.WaitFor("STATUS=stuck: a persist made no progress",
                               std::chrono::seconds(20));
  ASSERT_TRUE(stuck.has_value())
      << "the watchdog never saw the wedged persister";
  // From then on no ping: three whole timeouts pass in silence.
  std::vector<std::string> after;
  EXPECT_FALSE(
      notify_.WaitFor("WATCHDOG=1", milliseconds(3 * kWatchdogMs), &after)
          .has_value());

  daemon->Signal(SIGTERM);
  ASSERT_TRUE(
      notify_.WaitFor("STOPPING=1", std::chrono::seconds(10)).has_value());
  int status =
      daemon
          ->Wait();  // the drain gives up after 1 s; the hang is then released
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  client->reset();
}

TEST_F(SystemdNotifyTest,
       CoordinatorSaysReadyOnceItListensAndPingsTheWatchdog) {
  ASSERT_TRUE(notify_.bound());
  constexpr int kWatchdogMs = 800;
  Child coord({COORDINATOR_BINARY, "--insecure", "--listen", "127.0.0.1:0",
               "--state", dir_.path() + "/state"},
              {"NOTIFY_SOCKET=" + notify_.path(),
               "WATCHDOG_USEC=" + std::to_string(kWatchdogMs * 1000)},
              /*soft_nofile=*/256);
  std::vector<std::string> before;
  ASSERT_TRUE(notify_.WaitFor("READY=1", std::chrono::seconds(30), &before)
                  .has_value());
  ASSERT_FALSE(before.empty());
  EXPECT_NE(before.front().find("STATUS=loading state"), std::string::npos)
      << before.front();
  // It printed its port before READY=1; the port answers.
  EXPECT_TRUE(GetClusterOnPrintedPort(coord).ok());
  // Started with systemd's kind of soft limit, it raised it: a connection
  // per node calling it directly.
  auto [soft, hard] = coord.DescriptorLimits();
  EXPECT_EQ(soft, hard) << "started at 256";
  ExpectPingsUnder(4, kWatchdogMs);
  ExpectStopsOnSigterm(coord);
}

// The relay needs no coordinator to serve: its nodes' calls fail over to
// the coordinator directly (coordinator 127.0.0.1:1 answers nothing).
TEST_F(SystemdNotifyTest, RelaySaysReadyOnceItListensAndStoppingOnSigterm) {
  ASSERT_TRUE(notify_.bound());
  constexpr int kWatchdogMs = 800;
  Child relay({RELAY_BINARY, "--insecure", "--listen", "127.0.0.1:0",
               "--coordinator", "127.0.0.1:1", "--relay-id", "rack-1"},
              {"NOTIFY_SOCKET=" + notify_.path(),
               "WATCHDOG_USEC=" + std::to_string(kWatchdogMs * 1000)},
              /*soft_nofile=*/256);
  auto ready = notify_.WaitFor("READY=1", std::chrono::seconds(30));
  ASSERT_TRUE(ready.has_value()) << "no READY=1 from ckpt-relay";
  EXPECT_NE(ready->find("STATUS=relaying 127.0.0.1:"), std::string::npos)
      << *ready;
  // It printed its port before READY=1; the port answers a node's call
  // (UNIMPLEMENTED: a relay carries only heartbeats and reports).
  EXPECT_EQ(GetClusterOnPrintedPort(relay).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  auto [soft, hard] = relay.DescriptorLimits();
  EXPECT_EQ(soft, hard) << "started at 256: a connection per node of its rack";
  // Idle, nothing waits for an answer: it pings.
  ExpectPingsUnder(3, kWatchdogMs);
  ExpectStopsOnSigterm(relay);
}

// ProgressWatch's rule with made-up times: stuck only with work pending
// and the counter still for the whole allowance.
TEST(ProgressWatchTest,
     StuckOnlyWhenWorkIsPendingAndTheCounterStandsStillTooLong) {
  ProgressWatch w(std::chrono::seconds(10));
  Clock::time_point t0{};
  EXPECT_TRUE(w.Healthy(5, true, t0));
  EXPECT_TRUE(w.Healthy(5, true, t0 + std::chrono::seconds(9)));
  EXPECT_FALSE(w.Healthy(5, true, t0 + std::chrono::seconds(10)));
  EXPECT_TRUE(
      w.Healthy(6, true, t0 + std::chrono::seconds(11)));  // moved again
  EXPECT_TRUE(
      w.Healthy(6, false, t0 + std::chrono::seconds(100)));  // idle is fine
  EXPECT_TRUE(
      w.Healthy(6, true, t0 + std::chrono::seconds(105)));  // work from then on
  EXPECT_FALSE(w.Healthy(6, true, t0 + std::chrono::seconds(110)));
}

}  // namespace
}  // namespace ckpt::testing
