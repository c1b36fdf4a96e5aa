#include "daemon/peer_listener.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

absl::StatusOr<sockaddr_un> SocketAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return absl::InvalidArgumentError(
        "socket path: must be 1 to " +
        std::to_string(sizeof(addr.sun_path) - 1) + " bytes: " + path);
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// True if something accepts connections on the socket file.
bool SocketIsLive(const sockaddr_un& addr) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool live =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return live;
}

// How long the accept loop pauses after running out of descriptors.
constexpr int kOutOfDescriptorsPauseMs = 100;

// A warning at most every 10 s, with the count of the ones held back: a
// hostile client must not be able to fill the log either.
class RateLimitedWarning {
 public:
  void Warn(const std::string& msg) {
    auto now = std::chrono::steady_clock::now();
    if (count_ > 0 && now - last_ < std::chrono::seconds(10)) {
      ++held_back_;
      return;
    }
    LogWarning(held_back_
                   ? absl::StrCat(msg, " (and ", held_back_, " more like it)")
                   : msg);
    ++count_;
    held_back_ = 0;
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_;
  uint64_t count_ = 0;
  uint64_t held_back_ = 0;
};

int OpenSpareDescriptor() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

}  // namespace

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(
    const std::string& path, PeerListenerOptions options) {
  CKPT_ASSIGN_OR_RETURN(sockaddr_un addr, SocketAddress(path));
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return absl::AlreadyExistsError("socket path " + path +
                                      " exists and is not a socket");
    if (SocketIsLive(addr))
      return absl::AlreadyExistsError("socket " + path +
                                      ": another daemon is listening");
    unlink(path.c_str());
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "bind " + path);
  }
  chmod(path.c_str(), 0666);
  if (listen(fd, 512) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "listen " + path);
  }
  int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(err, "eventfd");
  }
  auto listener =
      std::unique_ptr<PeerListener>(new PeerListener(fd, wake, path, options));
  listener->spare_fd_ = OpenSpareDescriptor();
  return listener;
}

PeerListener::~PeerListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
  if (spare_fd_ >= 0) close(spare_fd_);
  unlink(path_.c_str());
}

void PeerListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void PeerListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  // An eventfd write fails only when its counter would overflow: the loop
  // is woken either way.
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
}

void PeerListener::AcceptLoop(grpc::Server* server) {
  RateLimitedWarning out_of_fds, over_limit;
  bool pause = false;
  for (;;) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    // After running out of descriptors, only the wake descriptor is
    // watched for a moment: the listening socket would be readable at once.
    int n = poll(fds, pause ? 1 : 2, pause ? kOutOfDescriptorsPauseMs : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents) return;
    if (pause) {
      pause = false;
      continue;
    }
    if (spare_fd_ < 0) spare_fd_ = OpenSpareDescriptor();
    int fd =
        accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        out_of_fds.Warn(
            absl::StrCat("out of file descriptors (", strerror(errno),
                         "): refusing new connections until some close"));
        ShedWaitingConnection();
        pause = true;
      }
      continue;  // EAGAIN, ECONNABORTED: the next one
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      close(fd);
      continue;
    }
    // Read now, while the peer is surely alive and its pid its own: the
    // coordinator tells a restarted trainer from one of an abandoned
    // generation by it.
    const PeerCreds creds{cred.pid, cred.uid, cred.gid,
                          ProcessStartMs(cred.pid)};
    if (!Admit(fd, creds)) {
      close(fd);
      over_limit.Warn(absl::StrCat("refused a connection of uid ", cred.uid,
                                   " (pid ", cred.pid, "): it holds ",
                                   options_.max_connections_per_uid,
                                   " connections (max_connections_per_uid)"));
      continue;
    }
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

bool PeerListener::Admit(int fd, const PeerCreds& creds) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  // Forget connections gRPC has closed since, counting this uid's others.
  uint32_t held = 0;
  for (auto it = connections_.begin(); it != connections_.end();) {
    struct stat now;
    if (it->first == fd || fstat(it->first, &now) != 0 ||
        now.st_dev != it->second.dev || now.st_ino != it->second.ino) {
      it = connections_.erase(it);
      continue;
    }
    if (it->second.creds.uid == creds.uid) ++held;
    ++it;
  }
  if (creds.uid != 0 && options_.max_connections_per_uid != 0 &&
      held >= options_.max_connections_per_uid)
    return false;
  // A number reused after gRPC closed an old connection is overwritten
  // here before the new connection can carry any call.
  connections_[fd] = Connection{creds, st.st_dev, st.st_ino};
  return true;
}

void PeerListener::ShedWaitingConnection() {
  if (spare_fd_ < 0) return;
  close(spare_fd_);
  int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd >= 0) close(fd);
  spare_fd_ = OpenSpareDescriptor();
}

std::optional<PeerCreds> PeerListener::Lookup(const std::string& peer) const {
  if (peer.rfind("fd:", 0) != 0) return std::nullopt;
  int fd = 0;
  for (size_t i = 3; i < peer.size(); ++i) {
    if (peer[i] < '0' || peer[i] > '9') return std::nullopt;
    fd = fd * 10 + (peer[i] - '0');
    if (fd > (1 << 24)) return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(fd);
  if (it == connections_.end()) return std::nullopt;
  return it->second.creds;
}

}  // namespace ckpt::daemon
