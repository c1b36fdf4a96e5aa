#include "util/status.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt {

absl::Status ErrnoToStatus(int err, std::string_view context) {
  std::string msg = std::string(context) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      std::string(context) + ": " + std::string(s.message()));
}

}  // namespace ckpt
