// ckptd's settings: one struct, filled in one place from the command line
// and an optional TOML config file (flags win over the file).
#ifndef CKPT_DAEMON_OPTIONS_H_
#define CKPT_DAEMON_OPTIONS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/engine.h"
#include "daemon/node_agent.h"
#include "storage/backend.h"

namespace ckpt::daemon {

struct DaemonOptions {
  std::string socket_path;
  std::string root;         // catalog; shards too unless shared_root is set
  std::string shared_root;  // shards, readable by every node (cluster mode)
  // Cluster mode: the coordinator to join (agent.coordinator), or serve
  // one in-process for a one-node job (coordinator_listen, HOST:PORT).
  bool cluster = false;
  std::string coordinator_listen;
  uint32_t heartbeat_timeout_ms = 3000;  // embedded coordinator only
  NodeAgentOptions agent;
  std::chrono::milliseconds drain_deadline = std::chrono::seconds(60);
  EngineOptions engine;
  storage::LocalBackendOptions storage;
};

// Parses argv. Returns InvalidArgument naming the flag or config key on a
// bad value; `--help` output goes to *help with code Cancelled.
absl::StatusOr<DaemonOptions> ParseDaemonOptions(int argc, char** argv, std::string* help);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_OPTIONS_H_
