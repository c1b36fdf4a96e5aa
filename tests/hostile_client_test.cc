// ckptd's socket driven as a hostile local client would: request bodies
// that do not parse, names of megabytes, more connections than a uid may
// hold, and connections until the daemon runs out of file descriptors. Each
// refusal is INVALID_ARGUMENT (or a closed connection) naming the field in
// a small reply, and the daemon keeps serving everyone else.
#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/daemon_test.h"
#include "tests/raw_grpc_call.h"
#include "tests/rpc_helpers.h"

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Refusals quote at most a prefix of what they refuse.
constexpr size_t kMaxReplyBytes = 1024;

class HostileClientTest : public DaemonTest {
 protected:
  void SetUp() override {}  // each test starts ckptd with its own flags
  void Start(std::vector<std::string> extra_args = {}) {
    auto d = DaemonProcess::Start(root(), run_.path(), prefix_,
                                  std::move(extra_args));
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    stub_ = daemon_->Stub();
  }

  // Sends `body` as the request of Ckptd method `method`, as is.
  grpc::Status RawCall(const std::string& method, const std::string& body) {
    return RawUnaryCall(grpc::CreateChannel("unix:" + daemon_->socket(),
                                            grpc::InsecureChannelCredentials()),
                        "/ckpt.v1.Ckptd/" + method, body,
                        std::chrono::seconds(60));
  }

  void ExpectServing() {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    v1::StatusResponse resp;
    grpc::Status s = stub_->Status(&ctx, v1::StatusRequest(), &resp);
    EXPECT_TRUE(s.ok()) << "daemon stopped serving: " << s.error_message();
  }

  std::unique_ptr<v1::Ckptd::Stub> stub_;
};

#define EXPECT_REFUSED(call, field)                                           \
  do {                                                                        \
    grpc::Status _s = (call);                                                 \
    EXPECT_EQ(_s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)            \
        << _s.error_message();                                                \
    EXPECT_NE(_s.error_message().find(field), std::string::npos)              \
        << "message does not name '" << field << "': " << _s.error_message(); \
    EXPECT_LT(_s.error_message().size(), kMaxReplyBytes);                     \
  } while (0)

std::string RegisterBody(const std::string& job) {
  v1::RegisterRequest req;
  req.set_job(job);
  req.set_world_size(1);
  req.set_slot_bytes(1 << 20);
  return req.SerializeAsString();
}

std::string CommitBody(const std::string& tensor_name) {
  v1::CommitSaveRequest req;
  req.set_job("j");
  req.set_lease(1);
  v1::TensorMeta* m = req.add_tensors();
  m->set_name("ok");
  m->set_bytes(4);
  m = req.add_tensors();
  m->set_name(tensor_name);
  m->set_bytes(4);
  return req.SerializeAsString();
}

TEST_F(HostileClientTest,
       RequestsThatDoNotParseAreInvalidArgumentNamingTheField) {
  Start();
  // Invalid UTF-8 in a name.
  EXPECT_REFUSED(RawCall("Register", RegisterBody("\xff\xfejob")), "job");
  EXPECT_REFUSED(RawCall("CommitSave", CommitBody("bad\xc3(")),
                 "tensors[1].name");
  // Truncated: the name's declared length runs past the end of the body.
  std::string body = RegisterBody("a-long-enough-job-name");
  EXPECT_REFUSED(RawCall("Register", body.substr(0, 10)), "job: truncated");
  body = CommitBody("tensor");
  EXPECT_REFUSED(RawCall("CommitSave", body.substr(0, body.size() - 3)),
                 "tensors[1]");
  // Malformed: a tag whose varint never ends, an end-group with no group.
  EXPECT_REFUSED(RawCall("Latest", std::string(12, '\xff')), "request");
  EXPECT_REFUSED(RawCall("Delete", std::string("\x0c", 1)), "job");
  // Random bodies, to every method: never INTERNAL, never an empty or a
  // large message, and the daemon keeps serving.
  std::mt19937 rng(8);
  for (const char* method : {"Register", "BeginSave", "CommitSave", "AbortSave",
                             "Latest", "OpenRestore", "CloseRestore",
                             "WaitDurable", "List", "Delete", "LayoutIndex"}) {
    for (int i = 0; i < 20; ++i) {
      std::string random(1 + rng() % 200, '\0');
      for (char& c : random) c = static_cast<char>(rng());
      grpc::Status s = RawCall(method, random);
      EXPECT_NE(s.error_code(), grpc::StatusCode::INTERNAL)
          << method << ": " << s.error_message();
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNKNOWN)
          << method << ": " << s.error_message();
      if (!s.ok()) {
        EXPECT_FALSE(s.error_message().empty()) << method;
        EXPECT_LT(s.error_message().size(), kMaxReplyBytes) << method;
      }
    }
  }
  ExpectServing();
  // The same daemon still does real work.
  auto client = Connect("after-garbage");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(1 << 20, 2, 5);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
}

TEST_F(HostileClientTest, HugeNamesAreRefusedWithASmallReplyNamingTheField) {
  Start();
  for (size_t bytes : {size_t{1} << 20, size_t{60} << 20}) {
    std::string huge(bytes, 'j');
    {
      grpc::ClientContext ctx;
      v1::RegisterRequest req;
      req.set_job(huge);
      req.set_world_size(1);
      req.set_slot_bytes(1 << 20);
      v1::RegisterResponse resp;
      EXPECT_REFUSED(stub_->Register(&ctx, req, &resp), "job");
    }
    {
      grpc::ClientContext ctx;
      v1::ListRequest req;
      req.set_job(huge);
      v1::ListResponse resp;
      EXPECT_REFUSED(stub_->List(&ctx, req, &resp), "job");
    }
    {
      v1::CommitSaveRequest req = v1::CommitSaveRequest();
      req.ParseFromString(CommitBody(huge));
      grpc::ClientContext ctx;
      v1::CommitSaveResponse resp;
      EXPECT_REFUSED(stub_->CommitSave(&ctx, req, &resp), "tensors[1].name");
    }
  }
  ExpectServing();
}

TEST_F(HostileClientTest, RequestsLargerThanMaxRequestMibAreRefusedUnread) {
  std::string config = run_.path() + "/ckptd.toml";
  std::ofstream(config) << "max_request_mib = 1\nmax_connections_per_uid = 0\n";
  Start({"--config", config});
  grpc::ClientContext ctx;
  v1::ListRequest req;
  req.set_job(std::string(2 << 20, 'j'));
  v1::ListResponse resp;
  EXPECT_EQ(stub_->List(&ctx, req, &resp).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  grpc::ClientContext ctx2;
  req.set_job(std::string(512 << 10, 'j'));
  EXPECT_REFUSED(stub_->List(&ctx2, req, &resp), "job");
  ExpectServing();
}

TEST_F(HostileClientTest, BadLimitInTheConfigFileStopsStartup) {
  std::string config = run_.path() + "/ckptd.toml";
  std::ofstream(config) << "max_request_mib = 0\n";
  auto d =
      DaemonProcess::Start(root(), run_.path(), prefix_, {"--config", config});
  EXPECT_FALSE(d.ok());
}

// A client process of uid 65534 that holds `total` idle connections; it
// reports how many the daemon closed (waiting for `expect` of them, then a
// little longer to see any more), then waits for a byte, closes them all
// and exits. Only system calls after fork(): the test process runs gRPC
// threads.
pid_t HoldConnections(const std::string& socket, int total, int expect,
                      int report_fd, int go_fd) {
  pid_t child = fork();
  if (child != 0) return child;
  if (setgid(65534) != 0 || setuid(65534) != 0) _exit(101);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof addr.sun_path - 1);
  int fds[256];
  for (int i = 0; i < total; ++i) {
    fds[i] = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fds[i], reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      _exit(102);
  }
  // A connection the daemon closed reads end-of-file; one it kept reads
  // gRPC's settings frame or nothing at all.
  bool closed[256] = {};
  int closed_count = 0;
  int extra_ms = 500;
  for (int waited_ms = 0; waited_ms < 20000 && extra_ms > 0; waited_ms += 50) {
    if (closed_count >= expect) extra_ms -= 50;
    for (int i = 0; i < total; ++i) {
      pollfd p{fds[i], POLLIN, 0};
      if (closed[i] || poll(&p, 1, 0) != 1) continue;
      char buf[256];
      if (read(fds[i], buf, sizeof buf) == 0) closed[i] = true, ++closed_count;
    }
    usleep(50 * 1000);
  }
  (void)!write(report_fd, &closed_count, sizeof closed_count);
  char go;
  (void)!read(go_fd, &go, 1);
  for (int i = 0; i < total; ++i) close(fds[i]);
  _exit(0);
}

int OpenDescriptors(pid_t pid) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

TEST_F(HostileClientTest,
       ConnectionsBeyondThePerUidLimitAreClosedAndOthersAreServed) {
  constexpr int kLimit = 8, kTotal = 20;
  Start({"--max-connections-per-uid", std::to_string(kLimit)});
  {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_job("mine");
    req.set_world_size(1);
    req.set_slot_bytes(1 << 20);
    v1::RegisterResponse resp;
    ASSERT_TRUE(stub_->Register(&ctx, req, &resp).ok());
  }
  const int baseline = OpenDescriptors(daemon_->pid());
  int report[2], go[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t child = HoldConnections(daemon_->socket(), kTotal, kTotal - kLimit,
                                report[1], go[0]);
  ASSERT_GT(child, 0);
  int closed = -1;
  ASSERT_EQ(read(report[0], &closed, sizeof closed),
            static_cast<ssize_t>(sizeof closed));
  EXPECT_EQ(closed, kTotal - kLimit);
  // Root (another uid) is served while uid 65534 holds its limit.
  ExpectServing();
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {report[0], report[1], go[0], go[1]}) close(fd);
  // Once gRPC has seen them close, uid 65534 connects again and is served
  // (uid_probe exits 0 only if every call got its PERMISSION_DENIED answer).
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (OpenDescriptors(daemon_->pid()) > baseline && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(RunUidProbe(daemon_->socket(), "mine", "/" + prefix_ + ".mine.r0"),
            0)
      << "bitmask of uid_probe's calls that were not answered";
  ExpectServing();
}

// utime + stime of pid, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(f)),
                  std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) /
         static_cast<double>(sysconf(_SC_CLK_TCK));
}

TEST_F(HostileClientTest,
       OutOfFileDescriptorsTheDaemonWaitsInsteadOfSpinningAndRecovers) {
  Start();
  ExpectServing();
  // Leave the daemon a handful of descriptors beyond what it holds now.
  const int held = OpenDescriptors(daemon_->pid());
  rlimit low{static_cast<rlim_t>(held + 8), static_cast<rlim_t>(held + 8)};
  ASSERT_EQ(prlimit(daemon_->pid(), RLIMIT_NOFILE, &low, nullptr), 0)
      << strerror(errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, daemon_->socket().c_str(),
               sizeof addr.sun_path - 1);
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    fds.push_back(fd);
  }
  // Wait until the daemon has used up its descriptors.
  const int limit = held + 8;
  for (auto deadline = Clock::now() + std::chrono::seconds(20);
       OpenDescriptors(daemon_->pid()) < limit && Clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Out of descriptors with connections still waiting: a spinning accept
  // loop burns a core (0.33 s per s measured on a shared, loaded 2-core
  // machine, ~1 s on an idle one); a waiting one next to nothing (0.01 s).
  double before = CpuSeconds(daemon_->pid());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  double used = CpuSeconds(daemon_->pid()) - before;
  EXPECT_LT(used, 0.2) << "CPU seconds in one second while out of descriptors";
  std::printf("ckptd used %.2f CPU seconds in 1 s out of descriptors\n", used);
  // The waiting connections are turned away (closed), not left hanging.
  bool refused = false;
  for (auto deadline = Clock::now() + std::chrono::seconds(20);
       !refused && Clock::now() < deadline;) {
    for (int fd : fds) {
      pollfd p{fd, POLLIN, 0};
      char buf[256];
      if (poll(&p, 1, 0) == 1 && recv(fd, buf, sizeof buf, MSG_PEEK) == 0)
        refused = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(refused) << "no waiting connection was closed at " << limit
                       << " descriptors";
  for (int fd : fds) close(fd);
  // The connections close, descriptors come back, new clients are served.
  stub_ = daemon_->Stub();
  ExpectServing();
}

}  // namespace
}  // namespace ckpt::testing
