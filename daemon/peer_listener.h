// PeerListener accepts connections on ckptd's Unix domain socket itself,
// records each peer's credentials (SO_PEERCRED: pid, uid, gid) and hands the
// connected socket to the gRPC server. gRPC names such a peer "fd:<n>", so a
// handler can look up who is calling with Lookup(context->peer()). This is
// what lets the daemon enforce that only the uid that registered a job
// touches it. Thread-safe.
#ifndef CKPT_DAEMON_PEER_LISTENER_H_
#define CKPT_DAEMON_PEER_LISTENER_H_

#include <sys/types.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
}

namespace ckpt::daemon {

struct PeerCreds {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class PeerListener {
 public:
  // Binds and listens on path (mode 0666: access is checked per job by
  // uid). A stale socket file nobody listens on is replaced; a live one is
  // AlreadyExists.
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(const std::string& path);
  ~PeerListener();

  // Starts accepting connections for server (which must outlive Stop()).
  void Start(grpc::Server* server);
  // Stops accepting; open connections stay with the server.
  void Stop();

  // Credentials of the peer gRPC calls `peer` ("fd:<n>").
  std::optional<PeerCreds> Lookup(const std::string& peer) const;

 private:
  PeerListener(int listen_fd, int wake_fd, std::string path)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), path_(std::move(path)) {}
  void AcceptLoop(grpc::Server* server);

  const int listen_fd_;
  const int wake_fd_;
  const std::string path_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<int, PeerCreds> creds_by_fd_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_LISTENER_H_
