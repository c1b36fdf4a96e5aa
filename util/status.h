// Conversions of foreign errors into absl::Status, one function per source,
// so that every message names the call and the object it failed on.
#ifndef CKPT_UTIL_STATUS_H_
#define CKPT_UTIL_STATUS_H_

#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

// errno -> Status. ENOENT maps to NotFound, EACCES/EPERM to
// PermissionDenied, ENOSPC/ENOMEM/EDQUOT to ResourceExhausted, EINVAL to
// InvalidArgument, everything else to Internal. The message reads
// "<context>: <strerror>".
[[nodiscard]] absl::Status ErrnoToStatus(int err, std::string_view context);

// Prefixes a status' message with context, keeping its code.
[[nodiscard]] absl::Status Annotate(const absl::Status& s,
                                    std::string_view context);

}  // namespace ckpt

// Evaluates expr (an absl::Status); returns it from the caller when not ok.
#define CKPT_RETURN_IF_ERROR(expr)     \
  do {                                 \
    ::absl::Status _ckpt_s = (expr);   \
    if (!_ckpt_s.ok()) return _ckpt_s; \
  } while (0)

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)
// lhs = value of expr (an absl::StatusOr<T>), or returns its error.
#define CKPT_ASSIGN_OR_RETURN(lhs, expr)              \
  auto CKPT_CONCAT(_ckpt_or_, __LINE__) = (expr);     \
  if (!CKPT_CONCAT(_ckpt_or_, __LINE__).ok())         \
    return CKPT_CONCAT(_ckpt_or_, __LINE__).status(); \
  lhs = std::move(*CKPT_CONCAT(_ckpt_or_, __LINE__))

#endif  // CKPT_UTIL_STATUS_H_
