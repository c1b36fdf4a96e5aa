#include "util/validate.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/tensor.h"

namespace {
// Debian's abseil has its own string_view type.
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }
}  // namespace

namespace ckpt {

absl::Status ValidateJobName(std::string_view job, std::string_view field) {
  if (job.empty()) return absl::InvalidArgumentError(absl::StrCat(AV(field), ": empty"));
  if (job.size() > kMaxJobNameBytes)
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d bytes, at most %d allowed", AV(field), job.size(), kMaxJobNameBytes));
  if (job == "." || job == ".." || job.find("..") != std::string_view::npos)
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": '..' is not allowed"));
  if (job[0] == '.' || job[0] == '-')
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": may not start with '.' or '-'"));
  for (char c : job) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return absl::InvalidArgumentError(absl::StrFormat("%s: character 0x%02x is not allowed (use [A-Za-z0-9._-])", AV(field),
          static_cast<unsigned char>(c)));
  }
  return absl::OkStatus();
}

absl::Status ValidateTensorName(std::string_view name, std::string_view field) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(AV(field), ": empty"));
  if (name.size() > kMaxTensorNameBytes)
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d bytes, at most %d allowed", AV(field), name.size(), kMaxTensorNameBytes));
  for (char c : name) {
    if (c < 0x20 || c > 0x7e)
      return absl::InvalidArgumentError(absl::StrFormat("%s: non-printable character 0x%02x", AV(field), static_cast<unsigned char>(c)));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
