// ckptd's settings: one struct, filled in one place from the command line
// and an optional TOML config file (flags win over the file).
#ifndef CKPT_DAEMON_OPTIONS_H_
#define CKPT_DAEMON_OPTIONS_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/engine.h"
#include "storage/backend.h"

namespace ckpt::daemon {

struct DaemonOptions {
  std::string socket_path;
  std::string root;
  std::chrono::milliseconds drain_deadline = std::chrono::seconds(60);
  EngineOptions engine;
  storage::LocalBackendOptions storage;
};

// Parses argv. Returns InvalidArgument naming the flag or config key on a
// bad value; `--help` output goes to *help with code Cancelled.
absl::StatusOr<DaemonOptions> ParseDaemonOptions(int argc, char** argv, std::string* help);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_OPTIONS_H_
