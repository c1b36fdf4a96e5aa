// The files through which ckptrun and a trainer that restarts in its own
// process talk (one directory per trainer process, $CKPT_RESTART_DIR):
// `plan`, written by ckptrun, the assignment of the newest generation;
// `capable`, written by the trainer once it can restart in process
// ("pid=<its pid>"); `joined`, written by the trainer once it took plan G
// ("generation=<G>"). Small `key=value` lines; unknown keys are ignored
// (a newer writer), every value is validated: what the trainer writes is
// input from another process. Every write is atomic (a temporary file
// renamed over the name), so a reader never sees half a file.
// Thread-compatible: plain functions of their arguments and the file system.
#ifndef CKPT_TOOLS_RESTART_FILES_H_
#define CKPT_TOOLS_RESTART_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::tools {

// One trainer process's assignment in one generation.
struct TrainerPlan {
  uint64_t generation = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t local_rank = 0;
  uint32_t local_world_size = 0;
  std::string master_addr;
  uint32_t master_port = 0;
  std::optional<int64_t> restore_step;  // none: a fresh start
};

// The `plan` file's text, its keys in the contract's order.
std::string FormatPlan(const TrainerPlan& plan);

// `capable`: the pid the trainer says it has. Errors name the key.
[[nodiscard]] absl::StatusOr<pid_t> ParseCapable(absl::string_view text);
// `joined`: the generation the trainer took. Errors name the key.
[[nodiscard]] absl::StatusOr<uint64_t> ParseJoined(absl::string_view text);

// Writes `text` to dir/name through dir/name.tmp and a rename. Errors name
// the path.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& dir,
                                               const std::string& name,
                                               absl::string_view text);
// The contents of a small regular file (not followed if a symlink); NotFound
// when it is not there; an error naming the path when it is larger than
// `limit` bytes or cannot be read.
[[nodiscard]] absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                                        size_t limit = 4096);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_RESTART_FILES_H_
