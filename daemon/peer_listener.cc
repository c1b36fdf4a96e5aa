#include "daemon/peer_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>

#include "util/status.h"

namespace ckpt::daemon {
namespace {

absl::StatusOr<sockaddr_un> SocketAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return absl::InvalidArgumentError("socket path: must be 1 to " +
                                      std::to_string(sizeof(addr.sun_path) - 1) +
                                      " bytes: " + path);
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

// True if something accepts connections on the socket file.
bool SocketIsLive(const sockaddr_un& addr) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool live = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return live;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(sockaddr_un addr, SocketAddress(path));
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return absl::AlreadyExistsError("socket path " + path + " exists and is not a socket");
    if (SocketIsLive(addr))
      return absl::AlreadyExistsError("socket " + path + ": another daemon is listening");
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
  return std::unique_ptr<PeerListener>(new PeerListener(fd, wake, path));
}

PeerListener::~PeerListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void PeerListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void PeerListener::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  thread_.join();
}

void PeerListener::AcceptLoop(grpc::Server* server) {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;  // EAGAIN, ECONNABORTED, EMFILE: try again
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      close(fd);
      continue;
    }
    {
      // A number reused after gRPC closed an old connection is overwritten
      // here before the new connection can carry any call.
      std::lock_guard<std::mutex> lock(mu_);
      creds_by_fd_[fd] = PeerCreds{cred.pid, cred.uid, cred.gid};
    }
    grpc::AddInsecureChannelFromFd(server, fd);
  }
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
  auto it = creds_by_fd_.find(fd);
  if (it == creds_by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace ckpt::daemon
