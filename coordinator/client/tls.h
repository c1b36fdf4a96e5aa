// TLS settings of every coordinator connection (ckpt-coordinator, ckptd's
// node agent, ckptrun, ckptctl): the three PEM files of mutual TLS, or an
// explicit `--insecure` for plaintext. Loading turns them into gRPC
// credentials: a client presents its certificate and verifies the
// coordinator's against the CA; the server requires and verifies a client
// certificate (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY).
// Who may do what is decided by the server (coordinator/auth.h).
// Functions only; thread-safe.
#ifndef CKPT_COORDINATOR_CLIENT_TLS_H_
#define CKPT_COORDINATOR_CLIENT_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckpt::coordinator {

struct TlsFiles {
  std::string cert;       // --tls-cert: this side's certificate chain (PEM)
  std::string key;        // --tls-key: its private key (PEM)
  std::string ca;         // --tls-ca: the CA that signs every peer (PEM)
  bool insecure = false;  // --insecure: plaintext, no identity

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// InvalidArgument naming the flag (`flags` + "-cert"/"-key"/"-ca") when
// only some of the three files are given, or TLS files and --insecure both;
// with `require_choice` (the coordinator) also when neither TLS nor
// --insecure is given.
[[nodiscard]] absl::Status ValidateTlsFlags(const TlsFiles& tls,
                                            bool require_choice,
                                            std::string_view flags = "--tls");

// Reads the files (an unreadable or empty one is InvalidArgument naming its
// flag, `flags` + "-cert"/"-key"/"-ca", and path). Without TLS files:
// plaintext credentials.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
LoadClientCredentials(const TlsFiles& tls, std::string_view flags = "--tls");
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
LoadServerCredentials(const TlsFiles& tls);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CLIENT_TLS_H_
