// Test helper: a real S3-compatible server for the object-storage tests.
// S3Server runs s3rver (tests/s3/server.js; installed by
// scripts/install-deps.sh with `npm ci --prefix tests/s3`) on 127.0.0.1
// with its data in a temp directory and one bucket; Kill() and Restart()
// (same port, same data) simulate a crashed store. FaultProxy runs
// tests/s3/fault_proxy.py (Debian's /usr/bin/python3 + botocore) in front
// of it: it counts requests, verifies SigV4 signatures, and injects 5xx,
// SlowDown, stalls, cut connections and corrupted signatures on demand.
// Children get SIGKILL when the test process dies; destructors kill and
// reap them. Header-only; not thread-safe.
#ifndef CKPT_TESTS_S3_SERVER_H_
#define CKPT_TESTS_S3_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "storage/object_backend.h"
#include "tests/temp_dir.h"

#ifndef CKPT_SOURCE_DIR
#error "tests/s3_server.h needs CKPT_SOURCE_DIR defined by the test target"
#endif

namespace ckpt::testing {

inline constexpr char kS3Bucket[] = "ckpt-test";
inline constexpr char kS3AccessKey[] = "S3RVER";  // s3rver's built-in account
inline constexpr char kS3SecretKey[] = "S3RVER";

// A child process whose first stdout line is "port N".
class PortProcess {
 public:
  PortProcess() = default;
  ~PortProcess() { Kill(); }
  PortProcess(const PortProcess&) = delete;
  PortProcess& operator=(const PortProcess&) = delete;

  // Returns the port it printed, or 0.
  int Start(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) return 0;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(fds[1], 1);
      close(fds[0]);
      std::vector<char*> args;
      for (const std::string& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    int port = 0;
    FILE* out = fdopen(fds[0], "r");
    char line[128] = {};
    if (out && std::fgets(line, sizeof line, out) &&
        std::strncmp(line, "port ", 5) == 0)
      port = std::atoi(line + 5);
    if (out) std::fclose(out);
    return port;
  }
  void Kill(int sig = SIGKILL) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

// What a ckptd (or ckptctl) child takes the store's endpoint and
// credentials from: the environment, set for `endpoint`.
inline void ExportS3Environment(const std::string& endpoint) {
  setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  setenv("AWS_ACCESS_KEY_ID", kS3AccessKey, 1);
  setenv("AWS_SECRET_ACCESS_KEY", kS3SecretKey, 1);
  setenv("AWS_REGION", "us-east-1", 1);
}

class S3Server {
 public:
  // Why the server cannot run here, or "" (for GTEST_SKIP).
  static std::string Unavailable() {
    if (std::system("command -v node >/dev/null 2>&1") != 0)
      return "node is not installed";
    if (!std::filesystem::exists(std::string(CKPT_SOURCE_DIR) +
                                 "/tests/s3/node_modules/s3rver"))
      return "s3rver is not installed (scripts/install-deps.sh runs npm ci "
             "--prefix tests/s3)";
    return "";
  }

  S3Server() { port_ = Launch(0); }
  // Same port and data: a store that crashed and came back.
  bool Restart() {
    process_.Kill();
    for (int i = 0; i < 50; ++i) {
      if (Launch(port_) == port_) return true;
      process_.Kill();
      usleep(100000);
    }
    return false;
  }
  void Kill() { process_.Kill(); }
  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  std::string endpoint() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }
  const std::string& data_dir() const { return dir_.path(); }

  // Options for an ObjectBackend on this server, under `prefix`, with
  // retries quick enough for tests.
  storage::ObjectStoreOptions Options(const std::string& prefix) const {
    storage::ObjectStoreOptions o;
    o.endpoint = endpoint();
    o.bucket = kS3Bucket;
    o.prefix = prefix;
    o.credentials = {kS3AccessKey, kS3SecretKey, ""};
    o.part_size = 5 << 20;
    o.concurrency = 4;
    o.verify_part_md5 = true;  // exercised by every test
    o.backoff_base_ms = 20;
    o.backoff_max_ms = 500;
    o.stall_timeout_ms = 3000;  // a loaded CI machine can be slow to answer
    o.connect_timeout_ms = 1000;
    o.retry_budget_ms = 20000;
    return o;
  }

 private:
  int Launch(int port) {
    // s3rver's ListObjectsV2 continuation tokens use DES, which Node 17+
    // (OpenSSL 3) only has in the legacy provider.
    return process_.Start({"node", "--openssl-legacy-provider",
                           std::string(CKPT_SOURCE_DIR) + "/tests/s3/server.js",
                           dir_.path(), std::to_string(port), kS3Bucket});
  }
  TempDir dir_;
  PortProcess process_;
  int port_ = 0;
};

class FaultProxy {
 public:
  // verify: check every request's SigV4 signature with s3rver's secret.
  FaultProxy(const S3Server& server, bool verify = true) {
    std::vector<std::string> argv = {
        "/usr/bin/python3",
        std::string(CKPT_SOURCE_DIR) + "/tests/s3/fault_proxy.py", "--upstream",
        "127.0.0.1:" + std::to_string(server.port())};
    if (verify) argv.insert(argv.end(), {"--secret", kS3SecretKey});
    port_ = process_.Start(argv);
  }
  bool ok() const { return port_ > 0; }
  std::string endpoint() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }

  // Queues a fault (fault_proxy.py's control query), e.g.
  // "kind=status&status=503&code=SlowDown&count=2&match=PUT".
  bool Fault(const std::string& query) {
    return !Control("POST", "/__proxy/fault?" + query).empty();
  }
  void Reset() { Control("POST", "/__proxy/reset"); }
  // "requests", "rejected" or "faults_left" from the stats.
  long Stat(const std::string& name) {
    std::string body = Control("GET", "/__proxy/stats");
    size_t at = body.find(name + " ");
    return at == std::string::npos
               ? -1
               : std::atol(body.c_str() + at + name.size() + 1);
  }

 private:
  // One request on its own connection; the reply body, or "" on failure.
  std::string Control(const std::string& method, const std::string& target) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string reply;
    if (fd >= 0 &&
        connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      std::string req = method + " " + target +
                        " HTTP/1.1\r\nHost: proxy\r\nContent-Length: "
                        "0\r\nConnection: close\r\n\r\n";
      if (write(fd, req.data(), req.size()) ==
          static_cast<ssize_t>(req.size())) {
        shutdown(fd, SHUT_WR);
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) reply.append(buf, n);
      }
    }
    if (fd >= 0) close(fd);
    size_t body = reply.find("\r\n\r\n");
    if (reply.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos)
      return "";
    return reply.substr(body + 4).empty() ? "ok" : reply.substr(body + 4);
  }

  PortProcess process_;
  int port_ = 0;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_S3_SERVER_H_
