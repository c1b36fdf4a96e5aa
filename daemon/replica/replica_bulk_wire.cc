// The bulk path's wire (replica_bulk_wire.h).
#include "daemon/replica/replica_bulk_wire.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::daemon {

namespace {

constexpr char kHeaderMagic[8] = {'C', 'K', 'P', 'T', 'B', 'L', 'K', '1'};
constexpr char kReplyMagic[8] = {'C', 'K', 'P', 'T', 'B', 'R', 'S', '1'};

void Put32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
void Put64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint32_t Get32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
uint64_t Get64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
bool AllZero(const char* p, size_t n) {
  return std::all_of(p, p + n, [](char c) { return c == 0; });
}

bool Overdue(BulkDeadline deadline, BulkDeadline last,
             std::chrono::milliseconds stall) {
  const auto now = std::chrono::steady_clock::now();
  return now >= deadline || now - last >= stall;
}

bool Cancelled(const std::atomic<bool>* cancel) {
  return cancel != nullptr && cancel->load(std::memory_order_relaxed);
}

absl::Status CancelledStatus(std::string_view what) {
  return absl::CancelledError(absl::StrCat(std::string(what), ": cancelled"));
}

}  // namespace

const char* BulkKindName(BulkKind kind) {
  return kind == BulkKind::kPut ? "put" : "get";
}

std::array<char, kBulkHeaderBytes> EncodeBulkHeader(const BulkHeader& h) {
  std::array<char, kBulkHeaderBytes> out{};
  std::memcpy(out.data(), kHeaderMagic, 8);
  Put32(out.data() + 8, static_cast<uint32_t>(h.kind));
  std::memcpy(out.data() + 16, h.token.data(),
              std::min(h.token.size(), kBulkTokenBytes));
  Put64(out.data() + 32, h.offset);
  Put64(out.data() + 40, h.length);
  return out;
}

absl::StatusOr<BulkHeader> DecodeBulkHeader(const char* p) {
  if (std::memcmp(p, kHeaderMagic, 8) != 0)
    return absl::InvalidArgumentError(
        "magic: not a ckptd bulk transfer (expected \"CKPTBLK1\")");
  const uint32_t kind = Get32(p + 8);
  if (kind != static_cast<uint32_t>(BulkKind::kPut) &&
      kind != static_cast<uint32_t>(BulkKind::kGet))
    return absl::InvalidArgumentError(
        absl::StrCat("kind: ", kind, " is neither 1 (put) nor 2 (get)"));
  if (!AllZero(p + 12, 4) || !AllZero(p + 48, 16))
    return absl::InvalidArgumentError("reserved: bytes that must be zero");
  BulkHeader h;
  h.kind = static_cast<BulkKind>(kind);
  h.token.assign(p + 16, kBulkTokenBytes);
  h.offset = Get64(p + 32);
  h.length = Get64(p + 40);
  return h;
}

absl::Status SendAll(int fd, const char* p, uint64_t n, BulkDeadline deadline,
                     std::string_view what, std::chrono::milliseconds stall,
                     const std::atomic<bool>* cancel) {
  auto last = std::chrono::steady_clock::now();
  while (n > 0) {
    if (Cancelled(cancel)) return CancelledStatus(what);
    const ssize_t w = send(fd, p, std::min(n, kBulkIoBytes), MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<uint64_t>(w);
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Overdue(deadline, last, stall))
        return absl::DeadlineExceededError(
            absl::StrCat(std::string(what), ": the peer stopped reading"));
      continue;
    }
    return absl::UnavailableError(
        absl::StrCat(std::string(what),
                     ": send: ", w < 0 ? std::strerror(errno) : "closed"));
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, char* p, uint64_t n, BulkDeadline deadline,
                     std::string_view what, std::chrono::milliseconds stall,
                     const std::atomic<bool>* cancel) {
  auto last = std::chrono::steady_clock::now();
  while (n > 0) {
    if (Cancelled(cancel)) return CancelledStatus(what);
    const ssize_t r = recv(fd, p, std::min(n, kBulkIoBytes), MSG_WAITALL);
    if (r > 0) {
      p += r;
      n -= static_cast<uint64_t>(r);
      last = std::chrono::steady_clock::now();
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Overdue(deadline, last, stall))
        return absl::DeadlineExceededError(
            absl::StrCat(std::string(what), ": the peer stopped sending"));
      continue;
    }
    return absl::UnavailableError(absl::StrCat(
        std::string(what), ": the connection ended ", n, " bytes short",
        r < 0 ? ": " : "", r < 0 ? std::strerror(errno) : ""));
  }
  return absl::OkStatus();
}

absl::Status WriteBulkReply(int fd, const absl::Status& status, uint64_t digest,
                            BulkDeadline deadline) {
  const absl::string_view msg = status.message().substr(0, kMaxBulkMessage);
  std::string out(kBulkReplyBytes, '\0');
  std::memcpy(out.data(), kReplyMagic, 8);
  Put32(out.data() + 8, static_cast<uint32_t>(status.code()));
  Put32(out.data() + 12, static_cast<uint32_t>(msg.size()));
  Put64(out.data() + 16, digest);
  out.append(msg.data(), msg.size());
  return SendAll(fd, out.data(), out.size(), deadline, "bulk reply");
}

absl::Status ReadBulkReply(int fd, BulkDeadline deadline, std::string_view what,
                           uint64_t* digest, const std::atomic<bool>* cancel) {
  char head[kBulkReplyBytes];
  CKPT_RETURN_IF_ERROR(
      RecvAll(fd, head, sizeof head, deadline, what, kNoStallLimit, cancel));
  if (std::memcmp(head, kReplyMagic, 8) != 0)
    return absl::DataLossError(
        absl::StrCat(std::string(what), ": reply.magic: not a bulk reply"));
  const uint32_t code = Get32(head + 8);
  const uint32_t len = Get32(head + 12);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated))
    return absl::DataLossError(absl::StrCat(
        std::string(what), ": reply.code: ", code, " is not a status code"));
  if (len > kMaxBulkMessage)
    return absl::DataLossError(absl::StrCat(std::string(what),
                                            ": reply.message_bytes: ", len,
                                            " is over ", kMaxBulkMessage));
  if (!AllZero(head + 24, 8))
    return absl::DataLossError(
        absl::StrCat(std::string(what), ": reply.reserved: not zero"));
  std::string msg(len, '\0');
  CKPT_RETURN_IF_ERROR(RecvAll(fd, msg.data(), len, deadline, what));
  if (digest != nullptr) *digest = Get64(head + 16);
  if (code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat(std::string(what), ": ", msg));
}

void PrepareBulkSocket(int fd) {
  timeval tv{0, 250'000};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

absl::StatusOr<int> ConnectBulk(const std::string& host, uint32_t port,
                                BulkDeadline deadline) {
  const std::string where = absl::StrCat(host.substr(0, 80), ":", port);
  if (port == 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("port: ", port, " is not a port (", where, ")"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      rc != 0)
    return absl::UnavailableError(
        absl::StrCat("bulk connection to ", where, ": ", gai_strerror(rc)));
  absl::Status last = absl::UnavailableError(
      absl::StrCat("bulk connection to ", where, ": no address"));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last = ErrnoToStatus(errno, "bulk connection socket");
      continue;
    }
    // SO_SNDTIMEO bounds connect() too.
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    const int64_t us = std::clamp<int64_t>(left.count(), 1000, 10'000'000);
    timeval tv{static_cast<time_t>(us / 1'000'000),
               static_cast<suseconds_t>(us % 1'000'000)};
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(found);
      PrepareBulkSocket(fd);
      return fd;
    }
    last = absl::UnavailableError(
        absl::StrCat("bulk connection to ", where, ": ", std::strerror(errno)));
    close(fd);
  }
  freeaddrinfo(found);
  return last;
}

}  // namespace ckpt::daemon
