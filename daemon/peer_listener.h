// PeerListener accepts connections on ckptd's Unix domain socket itself,
// records each peer's credentials (SO_PEERCRED: pid, uid, gid) and hands the
// connected socket to the gRPC server. gRPC names such a peer "fd:<n>", so a
// handler can look up who is calling with Lookup(context->peer()). This is
// what lets the daemon enforce that only the uid that registered a job
// touches it.
//
// It also keeps a hostile local user from starving everyone else: a uid
// other than root may hold at most max_connections_per_uid connections (a
// further one is closed at once); and when the daemon runs out of file
// descriptors (EMFILE/ENFILE), the accept loop closes the waiting
// connection with the help of a spare descriptor it keeps for that purpose
// (as nginx and libuv do) and pauses briefly, instead of spinning on a
// listening socket it cannot accept from. Thread-safe.
#ifndef CKPT_DAEMON_PEER_LISTENER_H_
#define CKPT_DAEMON_PEER_LISTENER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "daemon/core/peer_creds.h"

namespace grpc {
class Server;
}

namespace ckpt::daemon {

struct PeerListenerOptions {
  // Connections one uid may hold at once; root is not limited; 0 = no limit.
  uint32_t max_connections_per_uid = 256;
};

class PeerListener {
 public:
  // Binds and listens on path (mode 0666: access is checked per job by
  // uid). A stale socket file nobody listens on is replaced; a live one is
  // AlreadyExists.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(
      const std::string& path, PeerListenerOptions options = {});
  ~PeerListener();

  // Starts accepting connections for server (which must outlive Stop()).
  void Start(grpc::Server* server);
  // Stops accepting; open connections stay with the server.
  void Stop();

  // Credentials of the peer gRPC calls `peer` ("fd:<n>").
  std::optional<PeerCreds> Lookup(const std::string& peer) const;

 private:
  // A connection handed to gRPC. gRPC closes the descriptor without telling
  // us; the socket's identity tells a live entry from a stale one whose
  // number was closed (and perhaps reused for something else).
  struct Connection {
    PeerCreds creds;
    dev_t dev = 0;
    ino_t ino = 0;
  };

  PeerListener(int listen_fd, int wake_fd, std::string path,
               PeerListenerOptions options)
      : listen_fd_(listen_fd),
        wake_fd_(wake_fd),
        path_(std::move(path)),
        options_(options) {}
  void AcceptLoop(grpc::Server* server);
  // Records fd's connection, or returns false if its uid is at its limit.
  bool Admit(int fd, const PeerCreds& creds);
  // Out of descriptors: accepts the oldest waiting connection with the
  // spare descriptor and closes it, so poll() stops reporting it.
  void ShedWaitingConnection();

  const int listen_fd_;
  const int wake_fd_;
  const std::string path_;
  const PeerListenerOptions options_;
  int spare_fd_ = -1;  // accept thread only
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<int, Connection> connections_;  // by fd
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_LISTENER_H_
