// The bulk path's tokens and listener (replica_bulk.h).
#include "daemon/replica/replica_bulk.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "util/status.h"
#include "util/thread_priority.h"

namespace ckpt::daemon {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::string> BulkTokens::Issue(BulkTransfer t) {
  std::string token(kBulkTokenBytes, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoToStatus(errno, "bulk token: getrandom");
    got += static_cast<size_t>(n);
  }
  Sweep();
  std::lock_guard<std::mutex> lock(mu_);
  pending_[token] = Entry{std::move(t), Clock::now() + ttl_};
  return token;
}

absl::StatusOr<BulkTransfer> BulkTokens::Take(const BulkHeader& h) {
  Sweep();
  std::unique_lock<std::mutex> lock(mu_);
  auto it = pending_.find(h.token);
  if (it == pending_.end()) {
    auto gone = gone_.find(h.token);
    if (gone == gone_.end())
      return absl::InvalidArgumentError(
          "token: unknown (not issued by this holder)");
    return absl::InvalidArgumentError(
        gone->second.first ? "token: expired before it was used"
                           : "token: already used (a token is good for one "
                             "connection)");
  }
  // A known token is spent by its first presentation, right or wrong.
  BulkTransfer t = std::move(it->second.transfer);
  pending_.erase(it);
  gone_[h.token] = {false, Clock::now() + 4 * ttl_};
  lock.unlock();
  if (h.kind != t.kind)
    return absl::InvalidArgumentError(
        absl::StrCat("kind: the token was issued for a ", BulkKindName(t.kind),
                     ", not a ", BulkKindName(h.kind)));
  if (h.offset != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "offset: ", h.offset, "; a transfer starts at 0 (", t.what, ")"));
  if (h.length != t.bytes)
    return absl::InvalidArgumentError(
        absl::StrCat("length: ", h.length, "; the offer was for ", t.bytes,
                     " bytes (", t.what, ")"));
  return t;
}

void BulkTokens::Sweep() {
  std::vector<BulkTransfer> expired;  // let go outside the lock
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    expired.push_back(std::move(it->second.transfer));
    gone_[it->first] = {true, now + 4 * ttl_};
    it = pending_.erase(it);
  }
  for (auto it = gone_.begin(); it != gone_.end();)
    it = it->second.second <= now ? gone_.erase(it) : std::next(it);
}

size_t BulkTokens::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

absl::StatusOr<std::unique_ptr<BulkListener>> BulkListener::Listen(
    const BulkListenerOptions& options, BulkTokens* tokens) {
  if (options.port < 0 || options.port > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica-bulk-port: ", options.port, " is not in [0, 65535]"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1)
    return absl::InvalidArgumentError(absl::StrCat("bulk listener address \"",
                                                   options.host.substr(0, 64),
                                                   "\": not an IPv4 address"));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "bulk listener socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, absl::StrCat("bulk listener on ", options.host,
                                           ":", options.port));
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    return ErrnoToStatus(err, "eventfd");
  }
  std::unique_ptr<BulkListener> l(
      new BulkListener(fd, wake, ntohs(addr.sin_port), options, tokens));
  l->accept_ = std::thread([p = l.get()] { p->AcceptLoop(); });
  return l;
}

BulkListener::~BulkListener() {
  Shutdown();
  close(listen_fd_);
  close(wake_fd_);
}

void BulkListener::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !accept_.joinable()) return;
    stopping_ = true;
    for (int fd : open_) shutdown(fd, SHUT_RDWR);  // their loops end
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  if (accept_.joinable()) accept_.join();
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return open_.empty(); });
}

BulkListenerStats BulkListener::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void BulkListener::AcceptLoop() {
  for (;;) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // Every second at least: expired tokens let go of their memory.
    if (poll(p, 2, 1000) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    tokens_->Sweep();
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)  // try again later
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ ||
        static_cast<int>(open_.size()) >= options_.max_connections) {
      ++stats_.refused;
      close(fd);
      continue;
    }
    open_.insert(fd);
    std::thread([this, fd] {
      Serve(fd);
      std::lock_guard<std::mutex> lock(mu_);
      open_.erase(fd);
      close(fd);
      idle_cv_.notify_all();
    }).detach();
  }
}

void BulkListener::Serve(int fd) {
  PrepareBulkSocket(fd);
  char raw[kBulkHeaderBytes];
  const auto header_deadline = Clock::now() + options_.header_timeout;
  if (!RecvAll(fd, raw, sizeof raw, header_deadline, "bulk header").ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.refused;
    return;
  }
  absl::StatusOr<BulkHeader> h = DecodeBulkHeader(raw);
  absl::StatusOr<BulkTransfer> t =
      h.ok() ? tokens_->Take(*h) : absl::StatusOr<BulkTransfer>(h.status());
  if (!t.ok()) {
    LogWarning(absl::StrCat("bulk transfer refused: ", t.status().message()));
    {
      // Counted before the caller hears of it.
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.refused;
    }
    (void)WriteBulkReply(fd, t.status(), 0, header_deadline);
    return;
  }
  // A replica arriving (receive and verify) must not take the training
  // step's CPU; a fetch for a recovery is on the critical path and keeps
  // its priority (util/thread_priority.h).
  if (t->kind == BulkKind::kPut) RunThisThreadInBackground("ckpt-bulk-put");
  uint64_t digest = 0;
  (void)Transfer(fd, *t, &digest);  // counts its outcome
}

absl::Status BulkListener::Transfer(int fd, BulkTransfer& t, uint64_t* digest) {
  // A transfer may take as long as its bytes need (a sender paced by its
  // --replica-bandwidth), but not stop for longer than stall_timeout.
  const auto never = Clock::time_point::max();
  const auto stall = options_.stall_timeout;
  if (absl::Status s =
          WriteBulkReply(fd, absl::OkStatus(), 0, Clock::now() + stall);
      !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failed;
    return s;
  }
  absl::Status s = t.kind == BulkKind::kPut
                       ? RecvAll(fd, t.dst, t.bytes, never, t.what, stall)
                       : SendAll(fd, t.src, t.bytes, never, t.what, stall);
  if (!s.ok()) {
    LogWarning(absl::StrCat("bulk ", BulkKindName(t.kind), " of ", t.what, ": ",
                            s.message()));
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.failed;
    return s;
  }
  absl::StatusOr<uint64_t> done = t.finish ? t.finish() : uint64_t{0};
  t.finish = nullptr;  // a refused put's memory goes back now
  t.pin.reset();
  if (done.ok()) *digest = *done;
  {
    // Counted before the caller hears the outcome.
    std::lock_guard<std::mutex> lock(mu_);
    ++(done.ok() ? stats_.served : stats_.failed);
  }
  CKPT_RETURN_IF_ERROR(WriteBulkReply(fd, done.status(), done.ok() ? *done : 0,
                                      Clock::now() + options_.stall_timeout));
  return done.status();
}

}  // namespace ckpt::daemon
