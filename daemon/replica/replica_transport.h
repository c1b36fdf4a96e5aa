// --replica-transport (doc/replicas.md "Transport"): how a node sends and
// fetches replicas (replica_bulk_client.h); a holder serves both.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_TRANSPORT_H_
#define CKPT_DAEMON_REPLICA_REPLICA_TRANSPORT_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

// bulk: the offer over the authenticated gRPC channel, the bytes over
// plain TCP with a one-time token; grpc: every byte inside the channel's
// TLS (encrypted).
enum class ReplicaTransport { kBulk, kGrpc };

// "bulk" or "grpc"; InvalidArgument naming `flag` otherwise.
[[nodiscard]] inline absl::StatusOr<ReplicaTransport> ParseReplicaTransport(
    std::string_view text, std::string_view flag) {
  if (text == "bulk") return ReplicaTransport::kBulk;
  if (text == "grpc") return ReplicaTransport::kGrpc;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(flag), ": '", std::string(text.substr(0, 32)),
                   "' is neither bulk nor grpc"));
}

inline const char* ReplicaTransportName(ReplicaTransport t) {
  return t == ReplicaTransport::kBulk ? "bulk" : "grpc";
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_TRANSPORT_H_
