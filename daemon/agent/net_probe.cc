#include "daemon/agent/net_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kChunk = 64 << 10;
constexpr auto kSlowPause = std::chrono::milliseconds(10);

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

// Waits until `fd` is ready for `events` or the deadline passes.
bool WaitReady(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// Reads exactly `len` bytes by the deadline; false on EOF, error or time.
bool ReadFull(int fd, char* buf, size_t len, Clock::time_point deadline) {
  size_t got = 0;
  while (got < len) {
    if (!WaitReady(fd, POLLIN, deadline)) return false;
    ssize_t n = recv(fd, buf + got, len - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      return false;
    }
  }
  return true;
}

bool WriteFull(int fd, const char* buf, size_t len,
               Clock::time_point deadline) {
  size_t put = 0;
  while (put < len) {
    if (!WaitReady(fd, POLLOUT, deadline)) return false;
    ssize_t n = send(fd, buf + put, len - put, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      put += static_cast<size_t>(n);
    } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return false;
    }
  }
  return true;
}

void PutLe64(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetLe64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NetProbeServer>> NetProbeServer::Listen(
    const NetProbeServerOptions& options) {
  if (options.port < 0 || options.port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("health net port ", options.port, ": not in [0, 65535]"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat("health net address \"",
                                                   options.host.substr(0, 64),
                                                   "\": not an IPv4 address"));
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "network check socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, 16) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, absl::StrCat("network check listener on ",
                                           options.host, ":", options.port));
  }
  int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "eventfd");
  }
  std::unique_ptr<NetProbeServer> s(
      new NetProbeServer(fd, wake, ntohs(addr.sin_port), options));
  s->thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

NetProbeServer::~NetProbeServer() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_fd_);
}

void NetProbeServer::Expect(const std::string& token,
                            Clock::time_point expiry) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  std::erase_if(expected_, [&](const auto& kv) { return kv.second < now; });
  expected_[token] = expiry;
}

bool NetProbeServer::TakeToken(const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(token);
  if (it == expected_.end()) return false;
  const bool fresh = it->second >= Clock::now();
  expected_.erase(it);  // one use, whatever came of it
  return fresh;
}

void NetProbeServer::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)  // try again later
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // One probe at a time: the coordinator pairs each node with at most
    // two others, and every step below has a deadline.
    Serve(fd);
    close(fd);
  }
}

void NetProbeServer::Serve(int fd) {
  char header[kNetProbeTokenChars + 8];
  const auto header_deadline = Clock::now() + options_.header_timeout;
  if (!ReadFull(fd, header, sizeof header, header_deadline) ||
      !TakeToken(std::string(header, kNetProbeTokenChars))) {
    ++refused_;
    return;
  }
  const uint64_t want = GetLe64(header + kNetProbeTokenChars);
  if (want > kMaxNetProbeBytes) {
    ++refused_;
    return;
  }
  std::vector<char> buf(kChunk);
  uint64_t got = 0;
  const auto deadline = Clock::now() + options_.payload_timeout;
  while (got < want) {
    if (!WaitReady(fd, POLLIN, deadline)) break;
    ssize_t n = recv(fd, buf.data(), std::min<uint64_t>(kChunk, want - got),
                     MSG_DONTWAIT);
    if (n == 0) break;  // the sender's deadline cut the probe short
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      break;
    }
    got += static_cast<uint64_t>(n);
    if (options_.slow) std::this_thread::sleep_for(kSlowPause);
  }
  ++served_;  // before the answer: the sender may look once it has it
  char answer[8];
  PutLe64(got, answer);
  (void)WriteFull(fd, answer, sizeof answer,
                  Clock::now() + options_.header_timeout);
}

absl::StatusOr<NetProbeResult> RunNetProbe(const std::string& host, int port,
                                           const std::string& token,
                                           uint64_t bytes,
                                           std::chrono::milliseconds timeout,
                                           bool slow) {
  const std::string peer = absl::StrCat(host, ":", port);
  if (token.size() != kNetProbeTokenChars)
    return absl::InvalidArgumentError(
        absl::StrCat("network probe to ", peer, ": token of ", token.size(),
                     " characters, not ", kNetProbeTokenChars));
  if (bytes > kMaxNetProbeBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("network probe to ", peer, ": ", bytes, " bytes, at most ",
                     kMaxNetProbeBytes));
  if (port < 1 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "network probe to ", peer.substr(0, 80), ": port not in [1, 65535]"));
  sockaddr_in addr{};
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0)
    return absl::UnavailableError(absl::StrCat(
        "network probe to ", peer.substr(0, 80), ": ", gai_strerror(rc)));
  std::memcpy(&addr, found->ai_addr, sizeof addr);
  freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return ErrnoToStatus(errno, "network probe socket");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS)
    return ErrnoToStatus(errno,
                         absl::StrCat("network probe: connect to ", peer));
  int err = 0;
  socklen_t len = sizeof err;
  if (!WaitReady(fd, POLLOUT, deadline) ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
    return err != 0 ? ErrnoToStatus(
                          err, absl::StrCat("network probe: connect to ", peer))
                    : absl::DeadlineExceededError(absl::StrCat(
                          "network probe: connect to ", peer, " timed out"));
  char header[kNetProbeTokenChars + 8];
  std::memcpy(header, token.data(), kNetProbeTokenChars);
  PutLe64(bytes, header + kNetProbeTokenChars);
  if (!WriteFull(fd, header, sizeof header, deadline))
    return absl::UnavailableError(
        absl::StrCat("network probe: sending the header to ", peer, " failed"));
  std::vector<char> filler(kChunk, '\x5a');
  const auto data_start = Clock::now();
  NetProbeResult r;
  uint64_t sent = 0;
  while (sent < bytes) {
    const size_t n = std::min<uint64_t>(kChunk, bytes - sent);
    if (!WriteFull(fd, filler.data(), n, deadline)) {
      r.cut_off = true;
      break;
    }
    sent += n;
    if (slow) std::this_thread::sleep_for(kSlowPause);
  }
  shutdown(fd, SHUT_WR);  // the receiver answers what it got
  char answer[8];
  // A slow receiver drains what the kernel buffered after a cut-off.
  const auto answer_by =
      std::max(deadline, Clock::now()) +
      std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(2));
  if (!ReadFull(fd, answer, sizeof answer, answer_by))
    return absl::UnavailableError(absl::StrCat(
        "network probe: ", peer,
        " closed the connection without an answer (a token it does not "
        "expect, or it failed)"));
  r.bytes = GetLe64(answer);
  r.seconds = std::chrono::duration<double>(Clock::now() - data_start).count();
  r.mb_per_s =
      r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e6 : 0;
  return r;
}

}  // namespace ckpt::daemon
