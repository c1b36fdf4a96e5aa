// Opening the object tier (or a cluster's shared root) from a URL, for the
// daemon and the coordinator: "s3://BUCKET/PREFIX" is an S3-compatible
// store (the ObjectBackend; endpoint and credentials from the AWS
// environment); "file:///abs/dir" or a plain directory is a LocalBackend
// there, a stand-in with the same semantics through the Backend interface
// (tests, and a second disk). Functions only; thread-safe.
#ifndef CKPT_STORAGE_TIER_URL_H_
#define CKPT_STORAGE_TIER_URL_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/object_backend.h"

namespace ckpt::storage {

// Whether the URL names an object store (not a directory).
bool IsObjectStoreUrl(std::string_view url);

// Opens the backend the URL names: s3:// through OpenBackend
// (object_backend.h) with `config` (the config file's object_* keys) and
// the environment. `field` names the setting in errors (e.g.
// "--object-url"); at most a prefix of a bad URL is quoted.
// `for_reading_only`: do not remove leftovers of a crash (a directory
// other processes write to).
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> OpenTierBackend(
    std::string_view url, std::string_view field,
    const ObjectStoreConfig& config = {}, bool for_reading_only = false);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_TIER_URL_H_
