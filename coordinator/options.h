// ckpt-coordinator's settings: one struct, filled in one place from the
// command line and an optional TOML config file (flags win over the file).
#ifndef CKPT_COORDINATOR_OPTIONS_H_
#define CKPT_COORDINATOR_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace ckpt::coordinator {

struct CoordinatorServerOptions {
  std::string listen;  // HOST:PORT
  CoordinatorOptions coordinator;
};

// InvalidArgument naming the flag or config key on a bad value; `--help`
// output goes to *help with code Cancelled.
[[nodiscard]] absl::StatusOr<CoordinatorServerOptions> ParseCoordinatorOptions(
    int argc, char** argv, std::string* help);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_OPTIONS_H_
