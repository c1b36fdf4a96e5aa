// ckptd's replica flags (replica_options.h).
#include "daemon/replica/replica_options.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/keys.h"
#include "util/validate.h"

namespace ckpt::daemon {

void AddReplicaFlags(CLI::App& app, ReplicaOptions& o, std::string& target) {
  app.add_option("--domain", o.domain,
                 "this node's failure domain (e.g. a rack): replicas go to "
                 "another domain when there is one");
  app.add_option("--replicas", o.send,
                 "1 (default): send a copy of each hosted rank's newest "
                 "staged shard to the replica node the coordinator names; 0: "
                 "none");
  app.add_option("--replica-port", o.port,
                 "TCP port of the replica listener that holds other nodes' "
                 "copies and serves fetches (0, the default: none)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--replica-memory-bytes", o.memory_bytes,
                 "memory the replicas held here may take (default 8 GiB): "
                 "one copy per rank of the nodes that replicate here, plus "
                 "one arriving");
  app.add_option("--replica-bandwidth", o.bandwidth,
                 "bytes/s this node sends replicas at (0, the default: "
                 "unlimited)");
  app.add_option("--replica-transport", o.transport_text,
                 "bulk (default): offers over the authenticated gRPC "
                 "channel, the bytes over plain TCP with a one-time token; "
                 "grpc: every byte inside the channel's TLS (encrypted, "
                 "2-7x slower)");
  app.add_option("--replica-bulk-port", o.bulk_port,
                 "TCP port of the bulk listener beside --replica-port (0, "
                 "the default: any free port, named in each offer)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--replica-target", target,
                 "NODE@HOST:PORT: send replicas there rather than where the "
                 "coordinator says (static pairs, tests)");
}

absl::Status FinishReplicaOptions(ReplicaOptions& o, const std::string& target,
                                  bool cluster) {
  if (!o.domain.empty())
    if (absl::Status s = ValidatePrintable(o.domain, "--domain", 128); !s.ok())
      return s;
  if (o.memory_bytes == 0) o.memory_bytes = kDefaultReplicaMemoryBytes;
  absl::StatusOr<ReplicaTransport> transport =
      ParseReplicaTransport(o.transport_text, "--replica-transport");
  if (!transport.ok()) return transport.status();
  o.transport = *transport;
  if (!cluster && (o.port != 0 || !target.empty() || !o.domain.empty()))
    return absl::InvalidArgumentError(
        absl::StrCat(o.port != 0       ? "--replica-port"
                     : !target.empty() ? "--replica-target"
                                       : "--domain",
                     ": needs --coordinator (replicas are a cluster's)"));
  if (target.empty()) return absl::OkStatus();
  const size_t at = target.find('@');
  const size_t colon = target.rfind(':');
  uint32_t port = 0;
  if (at == std::string::npos || at == 0 || colon == std::string::npos ||
      colon < at + 2 || !absl::SimpleAtoi(target.substr(colon + 1), &port) ||
      port == 0 || port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--replica-target: '",
                                                   target.substr(0, 128),
                                                   "' is not NODE@HOST:PORT"));
  ReplicaPeer peer{target.substr(0, at), target.substr(at + 1, colon - at - 1),
                   port};
  if (absl::Status s =
          storage::ValidateNodeId(peer.node_id, "--replica-target");
      !s.ok())
    return s;
  o.fixed_target = std::move(peer);
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
