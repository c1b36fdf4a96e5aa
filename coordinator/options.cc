#include "coordinator/options.h"

#include <CLI/CLI.hpp>

#include "util/config_file.h"

namespace ckpt::coordinator {

absl::StatusOr<CoordinatorServerOptions> ParseCoordinatorOptions(int argc, char** argv,
                                                                 std::string* help) {
  CoordinatorServerOptions o;
  std::string config;
  uint32_t timeout_ms = 3000;
  CLI::App app{"ckpt-coordinator: coordinator of multi-node checkpointed jobs"};
  app.add_option("--listen", o.listen, "HOST:PORT to serve gRPC on (port 0: any free port)")->required();
  app.add_option("--state", o.coordinator.state_dir, "directory of the coordinator's RocksDB state")->required();
  app.add_option("--shared-root", o.coordinator.shared_root,
                 "shared storage root for global manifests (default: <state>/shared)");
  app.add_option("--heartbeat-timeout-ms", timeout_ms, "declare a node dead after this long without a heartbeat")
      ->check(CLI::Range(10u, 3600000u));
  app.add_option("--config", config, "TOML file with heartbeat_timeout_ms and shared_root (flags win)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    *help = app.help();
    return absl::CancelledError("help");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  if (!config.empty()) {
    auto parsed = ParseConfigFile(config);
    if (!parsed.ok()) return parsed.status();
    absl::Status s;
    if (!app.count("--heartbeat-timeout-ms")) {
      int64_t v = timeout_ms;
      s = FromToml(*parsed, "heartbeat_timeout_ms", &v);
      if (s.ok() && (v < 10 || v > 3600000))
        s = absl::InvalidArgumentError("config: heartbeat_timeout_ms: not an integer in [10, 3600000]");
      if (s.ok()) timeout_ms = static_cast<uint32_t>(v);
    }
    if (s.ok() && !app.count("--shared-root"))
      s = FromToml(*parsed, "shared_root", &o.coordinator.shared_root);
    if (!s.ok()) return s;
  }
  if (o.listen.rfind(':') == std::string::npos)
    return absl::InvalidArgumentError("--listen: \"" + o.listen + "\" is not HOST:PORT");
  if (o.coordinator.shared_root.empty()) o.coordinator.shared_root = o.coordinator.state_dir + "/shared";
  o.coordinator.heartbeat_timeout = std::chrono::milliseconds(timeout_ms);
  return o;
}

}  // namespace ckpt::coordinator
