// The object-store keys of a ckptd TOML config file, read in one place:
// object_endpoint, object_region, object_addressing ("path" | "virtual"),
// object_part_mib, object_concurrency, object_verify_md5,
// object_max_attempts, object_retry_budget_ms, object_connect_timeout_ms,
// object_stall_timeout_ms, object_credentials_file, object_profile.
// (No secret is a config key: credentials come from the environment or
// the credentials file.) Functions only; thread-safe.
#ifndef CKPT_STORAGE_OBJECT_CONFIG_H_
#define CKPT_STORAGE_OBJECT_CONFIG_H_

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/object_backend.h"

namespace ckpt::storage {

// Sets the fields of *config whose keys the table has; InvalidArgument
// naming the key on a value of the wrong type. Values are range-checked by
// ResolveObjectStoreOptions.
[[nodiscard]] absl::Status ReadObjectStoreConfig(const toml::table& table,
                                                 ObjectStoreConfig* config);
// The keys ReadObjectStoreConfig reads (for refusing the keys nothing reads).
std::vector<std::string> ObjectStoreConfigKeys();

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_OBJECT_CONFIG_H_
