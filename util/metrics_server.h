// MetricsServer: the HTTP `/metrics` endpoint of ckptd and ckpt-coordinator
// (`--metrics-listen HOST:PORT`), served by prometheus-cpp's Exposer
// (civetweb) from the collectables it is given; the text format is the
// library's, never ours.
//
// HOST is an IPv4 literal, a bracketed IPv6 literal or `localhost`; PORT 0
// picks a free port (port() says which). Start() checks the address and that
// the port can be bound, so a malformed value or a port in use is an
// InvalidArgument / Unavailable naming the flag, before anything listens.
//
// The server holds weak references: a collectable destroyed before the
// server is skipped at the next scrape. Thread-safety: the Exposer's threads
// call Collect() concurrently with the program; collectables must be
// thread-safe. Start and the destructor are called from one thread.
#ifndef CKPT_UTIL_METRICS_SERVER_H_
#define CKPT_UTIL_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace ckpt {

// Checks "HOST:PORT" as described above; InvalidArgument naming `flag` and
// quoting at most a prefix of the value.
[[nodiscard]] absl::Status ValidateMetricsListen(const std::string& addr,
                                                 const std::string& flag);

class MetricsServer {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& addr, const std::string& flag,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "HOST:PORT" with the real port.
  std::string address() const;

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;
  int port_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_UTIL_METRICS_SERVER_H_
