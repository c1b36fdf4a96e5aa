// ckptd's settings: one struct, filled in one place from the command line
// and an optional TOML config file (flags win over the file).
#ifndef CKPT_DAEMON_OPTIONS_H_
#define CKPT_DAEMON_OPTIONS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/agent/node_agent.h"
#include "daemon/engine/engine.h"
#include "daemon/health/health.h"
#include "daemon/peer_listener.h"
#include "daemon/replica/replica_options.h"
#include "storage/backend.h"
#include "storage/object_backend.h"

namespace ckpt::daemon {

struct DaemonOptions {
  std::string socket_path;
  std::string root;         // catalog; shards too unless shared_root is set
  std::string shared_root;  // shards, readable by every node (cluster mode)
  // The object tier (doc/object-tier.md): "s3://BUCKET/PREFIX" or a
  // directory. A shared root that is an object store URL is also the
  // object tier, with commit_tier object; shards then stay in --root too.
  std::string object_url;
  storage::ObjectStoreConfig object_config;  // the config file's object_* keys
  // Cluster mode: the coordinator to join (agent.coordinator), or serve
  // one in-process for a one-node job (coordinator_listen, HOST:PORT).
  bool cluster = false;
  std::string coordinator_listen;
  uint32_t heartbeat_timeout_ms = 3000;  // embedded coordinator only
  NodeAgentOptions agent;
  ReplicaOptions replicas;  // peer replicas (replica_options.h)
  std::chrono::milliseconds drain_deadline = std::chrono::seconds(60);
  EngineOptions engine;
  storage::LocalBackendOptions storage;
  PeerListenerOptions listener;  // connections per uid
  // Largest request gRPC reads; a larger one is RESOURCE_EXHAUSTED before
  // it is parsed. The largest legitimate one is a CommitSave of the most
  // tensors a shard may hold (about 20 MiB).
  uint32_t max_request_mib = 64;
  // Serve Prometheus metrics on HOST:PORT (util/metrics_server.h); empty: off.
  std::string metrics_listen;
  // Node health checks (health.h): run at every start before READY, or
  // only them with --health-check (exit status, --json output).
  bool health_check = false;
  bool health_json = false;
  HealthOptions health;
};

// Parses argv. Returns InvalidArgument naming the flag or config key on a
// bad value; `--help` output goes to *help with code Cancelled.
[[nodiscard]] absl::StatusOr<DaemonOptions> ParseDaemonOptions(
    int argc, char** argv, std::string* help);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_OPTIONS_H_
