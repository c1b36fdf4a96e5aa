#include "util/validate.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt/tensor.h"
#include "util/strings.h"

namespace {
// Debian's abseil has its own string_view type.
}  // namespace

namespace ckpt {

absl::Status ValidateJobName(std::string_view job, std::string_view field) {
  if (job.empty())
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": empty"));
  if (job.size() > kMaxJobNameBytes)
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, at most %d allowed", AV(field),
                        job.size(), kMaxJobNameBytes));
  if (job == "." || job == ".." || job.find("..") != std::string_view::npos)
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": '..' is not allowed"));
  if (job[0] == '.' || job[0] == '-')
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": may not start with '.' or '-'"));
  for (char c : job) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok)
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: character 0x%02x is not allowed (use [A-Za-z0-9._-])", AV(field),
          static_cast<unsigned char>(c)));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrintable(std::string_view value, std::string_view field,
                               size_t max_bytes, bool allow_empty) {
  if (value.empty() && !allow_empty)
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": empty"));
  if (value.size() > max_bytes)
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, at most %d allowed", AV(field),
                        value.size(), max_bytes));
  for (size_t i = 0; i < value.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c > 0x7e)
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: character 0x%02x at byte %d is not printable ASCII", AV(field),
          c, i));
  }
  return absl::OkStatus();
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int n;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      n = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= static_cast<size_t>(n)) return false;
    for (int k = 1; k <= n; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += n + 1;
  }
  return true;
}

std::string QuotePrefix(std::string_view value, size_t max_bytes) {
  if (value.size() <= max_bytes)
    return absl::StrCat("\"", absl::CEscape(AV(value)), "\"");
  return absl::StrCat("\"", absl::CEscape(AV(value.substr(0, max_bytes))),
                      "\"... (", value.size(), " bytes)");
}

absl::Status ValidateTensorName(std::string_view name, std::string_view field) {
  if (name.empty())
    return absl::InvalidArgumentError(absl::StrCat(AV(field), ": empty"));
  if (name.size() > kMaxTensorNameBytes)
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d bytes, at most %d allowed", AV(field),
                        name.size(), kMaxTensorNameBytes));
  for (char c : name) {
    if (c < 0x20 || c > 0x7e)
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: non-printable character 0x%02x", AV(field),
                          static_cast<unsigned char>(c)));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
