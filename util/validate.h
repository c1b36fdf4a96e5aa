// Validation of names that arrive from outside (RPCs, CLI, shard files).
// Each returns InvalidArgument naming the field when the value is refused.
// An error message never carries more than a short prefix of the value it
// refuses (QuotePrefix), so a hostile 60 MiB name gives a reply of a few
// hundred bytes. Stateless functions; thread-safe.
#ifndef CKPT_UTIL_VALIDATE_H_
#define CKPT_UTIL_VALIDATE_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

inline constexpr size_t kMaxJobNameBytes = 127;

// A job name becomes a directory and part of a shared-memory name: 1 to 127
// characters of [A-Za-z0-9._-], not "." or "..", not starting with '.' or '-'.
[[nodiscard]] absl::Status ValidateJobName(std::string_view job,
                                           std::string_view field = "job");
// A node id names the node's directory under the shared root and is a
// metrics label: the job-name rules, the error naming `field`.
[[nodiscard]] inline absl::Status ValidateNodeId(
    std::string_view id, std::string_view field = "node_id") {
  return ValidateJobName(id, field);
}
// Tensor names: 1 to kMaxTensorNameBytes printable ASCII characters.
[[nodiscard]] absl::Status ValidateTensorName(std::string_view name,
                                              std::string_view field);
// A free-form value shown to people (an address, a storage key): 1 to
// max_bytes printable ASCII characters (empty allowed when allow_empty).
[[nodiscard]] absl::Status ValidatePrintable(std::string_view value,
                                             std::string_view field,
                                             size_t max_bytes,
                                             bool allow_empty = false);

// True if s is well-formed UTF-8 (no overlong forms, no surrogates).
bool IsValidUtf8(std::string_view s);

// The value for an error message: C-escaped and double-quoted; one longer
// than max_bytes is cut to its first max_bytes bytes and followed by
// "... (N bytes)".
inline constexpr size_t kQuotedPrefixBytes = 64;
std::string QuotePrefix(std::string_view value,
                        size_t max_bytes = kQuotedPrefixBytes);

}  // namespace ckpt

#endif  // CKPT_UTIL_VALIDATE_H_
