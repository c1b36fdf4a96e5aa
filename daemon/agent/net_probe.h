// The network half of the node health check: a short TCP
// bandwidth test between two ckptds that the coordinator pairs.
//
// NetProbeServer listens on a TCP port of the node (--health-net-port) and
// sinks probes. Authentication: ckptds have no channel of their own to
// each other (their only authenticated channel is the mutual-TLS one to
// the coordinator), so the coordinator hands both ends of a pair the same
// one-time token (128 random bits) over that channel; the receiving end
// accepts a connection only when its first bytes are a token it was told
// to expect and not yet used, and forgets the token on first use or at its
// expiry. A stranger, or a replay of a token seen on the wire, gets the
// connection closed before any data is read. The payload itself is
// neither encrypted nor authenticated: it is filler.
//
// Wire format (client to server): 32 hex characters of token, the payload
// length as 8 bytes little-endian (at most kMaxNetProbeBytes), then the
// payload; the server answers the 8-byte count it received. Both ends are
// bounded in bytes and time: a probe cut off by its deadline reports the
// bandwidth of what went through.
//
// Test-only: a `slow` server or client sleeps 10 ms per 64 KiB (at most
// about 6.5 MB/s), a stand-in for a bad link (CKPTD_TEST_FAULT=
// slow-network). Thread-safe.
#ifndef CKPT_DAEMON_AGENT_NET_PROBE_H_
#define CKPT_DAEMON_AGENT_NET_PROBE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace ckpt::daemon {

inline constexpr uint64_t kMaxNetProbeBytes = 256ull << 20;
inline constexpr size_t kNetProbeTokenChars = 32;

struct NetProbeServerOptions {
  std::string host = "0.0.0.0";  // the address to bind
  int port = 0;                  // 0: a free port
  bool slow = false;             // test-only: see above
  // How long a connection may take for its token and length, and for the
  // whole payload.
  std::chrono::milliseconds header_timeout{2000};
  std::chrono::milliseconds payload_timeout{10000};
};

class NetProbeServer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NetProbeServer>> Listen(
      const NetProbeServerOptions& options);
  ~NetProbeServer();  // stops accepting, joins the thread

  int port() const { return port_; }
  // Accept one probe carrying `token` until `expiry`.
  void Expect(const std::string& token,
              std::chrono::steady_clock::time_point expiry);
  // Probes sunk, and connections refused (unknown token, bad header).
  uint64_t probes_served() const { return served_.load(); }
  uint64_t probes_refused() const { return refused_.load(); }

 private:
  NetProbeServer(int listen_fd, int wake_fd, int port,
                 NetProbeServerOptions options)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        port_(port),
        options_(std::move(options)) {}
  void AcceptLoop();
  void Serve(int fd);
  bool TakeToken(const std::string& token);

  const int listen_fd_;
  const int wake_fd_;  // an eventfd: written to stop the loop
  const int port_;
  const NetProbeServerOptions options_;
  std::mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> expected_;
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

struct NetProbeResult {
  uint64_t bytes = 0;  // acknowledged by the receiver
  double seconds = 0;
  double mb_per_s = 0;   // 1e6 bytes per second
  bool cut_off = false;  // the deadline ended it early
};

// Sends `bytes` (at most kMaxNetProbeBytes) to HOST:PORT with `token`;
// the whole probe (connect included) takes at most `timeout`. An error
// names the peer and the step that failed.
[[nodiscard]] absl::StatusOr<NetProbeResult> RunNetProbe(
    const std::string& host, int port, const std::string& token, uint64_t bytes,
    std::chrono::milliseconds timeout, bool slow = false);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_NET_PROBE_H_
