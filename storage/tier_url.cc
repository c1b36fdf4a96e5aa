// See tier_url.h.
#include "storage/tier_url.h"

#include "util/validate.h"

namespace ckpt::storage {

bool IsObjectStoreUrl(std::string_view url) {
  return url.substr(0, 5) == "s3://";
}

absl::StatusOr<std::unique_ptr<Backend>> OpenTierBackend(
    std::string_view url, std::string_view field,
    const ObjectStoreConfig& config, bool for_reading_only) {
  const std::string name(field);
  if (url.empty()) return absl::InvalidArgumentError(name + ": empty");
  if (IsObjectStoreUrl(url)) {
    OpenBackendOptions o;
    o.object = config;
    auto opened = OpenBackend(std::string(url), o);
    if (!opened.ok())
      return absl::Status(opened.status().code(),
                          name + ": " + std::string(opened.status().message()));
    return opened;
  }
  std::string_view dir = url;
  if (dir.substr(0, 7) == "file://") dir.remove_prefix(7);
  if (dir.empty() || dir.front() != '/' ||
      dir.find("://") != std::string_view::npos)
    return absl::InvalidArgumentError(
        name + ": " + QuotePrefix(url) +
        " is neither s3://BUCKET/PREFIX nor an absolute directory");
  LocalBackendOptions o;
  o.root = std::string(dir);
  o.direct_io = false;  // a stand-in for a remote store: the page cache is fine
  o.remove_tmp_files = !for_reading_only;
  return NewLocalBackend(o);
}

}  // namespace ckpt::storage
