// OpenBackend: the one factory that turns a URL into a storage::Backend,
// for ckptd (--object-url), the coordinator (shared_root) and ckptctl
// (--root, FILE). "s3://BUCKET[/PREFIX]" is an S3-compatible store (the
// ObjectBackend: endpoint and credentials from the config file's object_*
// keys, the AWS environment or a credentials file); "file:///dir" or a
// plain directory is a LocalBackend there, with the caller's options.
// Every error names options.field and quotes at most a prefix of the URL.
// Functions only; thread-safe.
#ifndef CKPT_STORAGE_OPEN_BACKEND_H_
#define CKPT_STORAGE_OPEN_BACKEND_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/object_backend.h"

namespace ckpt::storage {

struct OpenBackendOptions {
  // The setting the URL came from, e.g. "--object-url" or "shared_root".
  std::string field = "url";
  // A directory's LocalBackend; root is replaced by the directory.
  LocalBackendOptions local;
  // A directory may be relative (a command line's --root); a service's
  // settings must name an absolute one.
  bool relative_ok = false;
  // The directory must exist already (a reader that creates nothing):
  // NotFound naming the field if it does not, InvalidArgument if it is not
  // a directory.
  bool must_exist = false;
  // An object store's config-file keys and environment.
  ObjectStoreConfig object;
  EnvLookup env = ProcessEnv;
};

[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> OpenBackend(
    std::string_view url, const OpenBackendOptions& options);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_OPEN_BACKEND_H_
