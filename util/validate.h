// Validation of names that arrive from outside (RPCs, CLI, shard files).
// Each returns InvalidArgument naming the field when the value is refused.
#ifndef CKPT_UTIL_VALIDATE_H_
#define CKPT_UTIL_VALIDATE_H_

#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

inline constexpr size_t kMaxJobNameBytes = 127;

// A job name becomes a directory and part of a shared-memory name: 1 to 127
// characters of [A-Za-z0-9._-], not "." or "..", not starting with '.' or '-'.
absl::Status ValidateJobName(std::string_view job, std::string_view field = "job");
// Tensor names: 1 to kMaxTensorNameBytes printable ASCII characters.
absl::Status ValidateTensorName(std::string_view name, std::string_view field);

}  // namespace ckpt

#endif  // CKPT_UTIL_VALIDATE_H_
