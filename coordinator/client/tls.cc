#include "coordinator/client/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

namespace ckpt::coordinator {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::InvalidArgumentError(std::string(flag) + " \"" + path +
                                      "\": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  std::string pem = text.str();
  if (pem.find("-----BEGIN ") == std::string::npos)
    return absl::InvalidArgumentError(std::string(flag) + " \"" + path +
                                      "\": not a PEM file");
  return pem;
}

struct Pems {
  std::string cert, key, ca;
};

absl::StatusOr<Pems> ReadAll(const TlsFiles& tls, std::string_view flags) {
  const std::string f(flags);
  Pems p;
  absl::StatusOr<std::string> cert = ReadPem(tls.cert, (f + "-cert").c_str());
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(tls.key, (f + "-key").c_str());
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> ca = ReadPem(tls.ca, (f + "-ca").c_str());
  if (!ca.ok()) return ca.status();
  p.cert = std::move(*cert);
  p.key = std::move(*key);
  p.ca = std::move(*ca);
  return p;
}

}  // namespace

absl::Status ValidateTlsFlags(const TlsFiles& tls, bool require_choice,
                              std::string_view flags) {
  const std::string cert = std::string(flags) + "-cert",
                    key = std::string(flags) + "-key",
                    ca = std::string(flags) + "-ca";
  if (tls.enabled()) {
    if (tls.insecure)
      return absl::InvalidArgumentError("--insecure: not with " + cert + "/" +
                                        key + "/" + ca);
    if (tls.cert.empty())
      return absl::InvalidArgumentError(cert + ": required with " + key + "/" +
                                        ca);
    if (tls.key.empty())
      return absl::InvalidArgumentError(key + ": required with " + cert + "/" +
                                        ca);
    if (tls.ca.empty())
      return absl::InvalidArgumentError(ca + ": required with " + cert + "/" +
                                        key);
    return absl::OkStatus();
  }
  if (require_choice && !tls.insecure)
    return absl::InvalidArgumentError(cert + "/" + key + "/" + ca +
                                      ": required (mutual TLS), or --insecure "
                                      "for plaintext on a trusted network");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> LoadClientCredentials(
    const TlsFiles& tls, std::string_view flags) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  absl::StatusOr<Pems> p = ReadAll(tls, flags);
  if (!p.ok()) return p.status();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = p->ca;
  o.pem_private_key = p->key;
  o.pem_cert_chain = p->cert;
  return grpc::SslCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsFiles& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  absl::StatusOr<Pems> p = ReadAll(tls, "--tls");
  if (!p.ok()) return p.status();
  grpc::SslServerCredentialsOptions o(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = p->ca;
  o.pem_key_cert_pairs.push_back({p->key, p->cert});
  return grpc::SslServerCredentials(o);
}

}  // namespace ckpt::coordinator
