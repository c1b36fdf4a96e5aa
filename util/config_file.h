// The TOML config files of ckptd and ckpt-coordinator: one parse and one
// typed getter, so both refuse a bad file the same way, naming the file or
// the key. Header-only functions; thread-safe.
#ifndef CKPT_UTIL_CONFIG_FILE_H_
#define CKPT_UTIL_CONFIG_FILE_H_

#include <toml++/toml.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"

namespace ckpt {

[[nodiscard]] inline absl::StatusOr<toml::table> ParseConfigFile(
    const std::string& path) {
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError("config " + path + ": " +
                                      std::string(e.description()));
  }
}

// Sets *out from `key` when the file has it; a value of the wrong type is
// InvalidArgument naming the key. Integers must be non-negative.
template <typename T>
[[nodiscard]] absl::Status FromToml(const toml::table& t, const char* key,
                                    T* out) {
  const toml::node* n = t.get(key);
  if (!n) return absl::OkStatus();
  if constexpr (std::is_same_v<T, std::string>) {
    if (!n->is_string())
      return absl::InvalidArgumentError(std::string("config: ") + key +
                                        ": not a string");
    *out = *n->value<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!n->is_boolean())
      return absl::InvalidArgumentError(std::string("config: ") + key +
                                        ": not a boolean");
    *out = *n->value<bool>();
  } else {
    if (!n->is_integer() || *n->value<int64_t>() < 0)
      return absl::InvalidArgumentError(std::string("config: ") + key +
                                        ": not a non-negative integer");
    *out = static_cast<T>(*n->value<int64_t>());
  }
  return absl::OkStatus();
}

}  // namespace ckpt

#endif  // CKPT_UTIL_CONFIG_FILE_H_
