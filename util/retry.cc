#include "util/retry.h"

namespace ckpt {

bool IsUnreachable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kDeadlineExceeded;
}

bool IsTransient(absl::StatusCode code) {
  return IsUnreachable(code) || code == absl::StatusCode::kResourceExhausted;
}

}  // namespace ckpt
