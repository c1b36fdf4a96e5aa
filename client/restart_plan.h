// The files of in-process restart, shared by libckpt (the trainer's side)
// and ckptrun (the launcher's): ckptrun gives each trainer process its own
// directory ($CKPT_RESTART_DIR) and writes there the `plan` of the newest
// generation for that process; the trainer writes `capable` (it restarts
// in its process) and `joined` (it took plan G). Each file is small text,
// replaced atomically (written beside, then renamed over), and read back
// as input from another process: every field is validated and an error
// names the file and the key.
#ifndef CKPT_CLIENT_RESTART_PLAN_H_
#define CKPT_CLIENT_RESTART_PLAN_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/client.h"

namespace ckpt::restart {

inline constexpr char kDirVariable[] = "CKPT_RESTART_DIR";
inline constexpr char kPlanFile[] = "plan";
inline constexpr char kCapableFile[] = "capable";
inline constexpr char kJoinedFile[] = "joined";
// Longer files are refused unread past this.
inline constexpr size_t kMaxFileBytes = 4096;

// `key=value` lines in a fixed order; restore_step only when set.
[[nodiscard]] std::string FormatPlan(const RestartPlan& plan);
// Unknown keys are ignored (a newer launcher); a missing, repeated or bad
// one is InvalidArgument naming it.
[[nodiscard]] absl::StatusOr<RestartPlan> ParsePlan(std::string_view text);

// "pid=<pid>\n" / "generation=<G>\n", and back (the error names the key).
[[nodiscard]] std::string FormatCapable(int64_t pid);
[[nodiscard]] absl::StatusOr<int64_t> ParseCapable(std::string_view text);
[[nodiscard]] std::string FormatJoined(uint64_t generation);
[[nodiscard]] absl::StatusOr<uint64_t> ParseJoined(std::string_view text);

// Replaces dir/name with `text` (name.tmp written, then renamed over);
// mode 0600, never through a symbolic link.
[[nodiscard]] absl::Status WriteFile(const std::string& dir, const char* name,
                                     std::string_view text);
// dir/name whole; NotFound when absent, InvalidArgument when longer than
// kMaxFileBytes or a symbolic link.
[[nodiscard]] absl::StatusOr<std::string> ReadFile(const std::string& dir,
                                                   const char* name);

}  // namespace ckpt::restart

#endif  // CKPT_CLIENT_RESTART_PLAN_H_
