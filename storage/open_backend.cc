#include "storage/open_backend.h"

#include <sys/stat.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
absl::StatusOr<std::unique_ptr<Backend>> OpenBackend(
    std::string_view url, const OpenBackendOptions& options) {
  const std::string& field = options.field;
  if (url.empty()) return absl::InvalidArgumentError(field + ": empty");
  if (IsObjectUrl(url)) {
    absl::StatusOr<ObjectStoreOptions> o =
        ResolveObjectStoreOptions(url, options.object, options.env);
    if (!o.ok()) return Annotate(o.status(), field);
    absl::StatusOr<std::unique_ptr<Backend>> b =
        NewObjectBackend(*std::move(o));
    if (!b.ok()) return Annotate(b.status(), field);
    return b;
  }
  std::string_view dir = url;
  if (absl::StartsWith(AV(dir), "file://")) dir.remove_prefix(7);
  if (dir.empty() || dir.find("://") != std::string_view::npos ||
      (dir.front() != '/' && !options.relative_ok))
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", QuotePrefix(url), " is neither s3://BUCKET/PREFIX nor ",
        options.relative_ok ? "a directory" : "an absolute directory"));
  LocalBackendOptions local = options.local;
  local.root = std::string(dir);
  if (options.must_exist) {
    struct stat st;
    if (stat(local.root.c_str(), &st) != 0)
      return absl::NotFoundError(
          absl::StrCat(field, " ", local.root, ": no such directory"));
    if (!S_ISDIR(st.st_mode))
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", local.root, ": not a directory"));
  }
  absl::StatusOr<std::unique_ptr<Backend>> b =
      NewLocalBackend(std::move(local));
  if (!b.ok()) return Annotate(b.status(), field);
  return b;
}

}  // namespace ckpt::storage
