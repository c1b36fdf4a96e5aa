// ckpt-coordinator's settings: one struct, filled in one place from the
// command line and an optional TOML config file (flags win over the file).
#ifndef CKPT_COORDINATOR_OPTIONS_H_
#define CKPT_COORDINATOR_OPTIONS_H_

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/service.h"

namespace ckpt::coordinator {

struct CoordinatorServerOptions {
  std::string listen;  // HOST:PORT
  // Serve Prometheus metrics on HOST:PORT (util/metrics_server.h); empty: off.
  std::string metrics_listen;
  CoordinatorOptions coordinator;
  // --state etcd://HOST:PORT[,...]/PREFIX (HA; coordinator.state_dir is
  // then empty), else empty.
  std::string etcd_state;
  std::string
      advertise;  // HA: the address clients are sent to; default: listen
  int64_t lease_ttl_s =
      0;  // HA: leader lease; default ceil(heartbeat timeout), at least 2
  ServerSecurity security;
  // HA: TLS to etcd (--etcd-tls-cert/-key/-ca: client certificate, key and
  // the CA that signed etcd's server certificate); no files: plaintext.
  TlsFiles etcd_tls;
  // What the etcd client connects with: etcd_tls's files, read once while
  // parsing (plaintext without them).
  std::shared_ptr<grpc::ChannelCredentials> etcd_credentials;
};

// InvalidArgument naming the flag or config key on a bad value; `--help`
// output goes to *help with code Cancelled.
[[nodiscard]] absl::StatusOr<CoordinatorServerOptions> ParseCoordinatorOptions(
    int argc, char** argv, std::string* help);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPTIONS_H_
