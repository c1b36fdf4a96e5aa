// ckptd's peer-replica settings (doc/replicas.md): the flags, their
// checks, and where they go. Filled in one place with the rest of ckptd's
// options (options.cc calls these).
#ifndef CKPT_DAEMON_REPLICA_REPLICA_OPTIONS_H_
#define CKPT_DAEMON_REPLICA_REPLICA_OPTIONS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "daemon/replica/replica_transport.h"
#include "daemon/replica/replicator.h"
#include "util/config_file.h"

namespace ckpt::daemon {

struct ReplicaOptions {
  std::string domain;  // --domain: the node's failure domain ("" its own)
  // --replicas 1|0: send copies of this node's staged shards to the
  // replica target (default 1; nothing is sent without a target).
  bool send = true;
  // --replica-port: the listener that holds other nodes' copies and
  // serves fetches (0: none, the default).
  uint32_t port = 0;
  // --replica-memory-bytes: what the held copies (and one arriving, and
  // evicted ones still being read) may take; 0: --replica-memory-slots'
  // default, 8 GiB.
  uint64_t memory_bytes = 0;
  uint64_t bandwidth = 0;  // --replica-bandwidth, bytes/s; 0: unlimited
  // --replica-target NODE@HOST:PORT: send copies there instead of where
  // the coordinator says (static pairs, tests).
  std::optional<ReplicaPeer> fixed_target;
  // --replica-transport bulk|grpc: how this node sends and fetches copies
  // (replica_bulk_client.h); the listener serves both.
  ReplicaTransport transport = ReplicaTransport::kBulk;
  std::string transport_text = "bulk";
  // --replica-bulk-port: the bulk listener's port (0: any free one, named
  // in each offer).
  uint32_t bulk_port = 0;
};

inline constexpr uint64_t kDefaultReplicaMemoryBytes = 8ull << 30;

// Adds the flags (each also a config key, config_file.h); `target`
// receives --replica-target's text.
void AddReplicaFlags(CLI::App& app, ReplicaOptions& o, std::string& target);
// Checks the values (InvalidArgument naming the flag) and parses `target`.
[[nodiscard]] absl::Status FinishReplicaOptions(ReplicaOptions& o,
                                                const std::string& target,
                                                bool cluster);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_OPTIONS_H_
