// The TOML config files of ckptd and ckpt-coordinator: one parse, and the
// keys derived from the binary's CLI11 flags, so the flags and the keys
// cannot drift: flag --foo-bar is key foo_bar (--no-foo is key foo with the
// opposite value), its value goes through the flag's own conversion and
// checks, and a key that names no flag is refused naming the nearest valid
// one. Both refuse a bad file the same way, naming the file and the key.
// Header-only functions; thread-safe.
#ifndef CKPT_UTIL_CONFIG_FILE_H_
#define CKPT_UTIL_CONFIG_FILE_H_

#include <toml++/toml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

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

// The exceptions to "flag --foo-bar is key foo_bar", declared beside the
// flags they name.
struct ConfigKeyRules {
  // Flags that are no setting (modes, the config file itself): no key.
  std::vector<std::string> command_line_only;
  // {alias, flag}: two flags that set one thing; a key of either applies
  // only when neither flag was given (the alias's key, read later, wins
  // over the flag's when the file has both).
  std::vector<std::pair<std::string, std::string>> aliases;
  // Keys that another reader takes from the same file (not flags).
  std::vector<std::string> other_keys;
};

namespace config_internal {

inline size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The key of a long flag: "--no-io-uring" is {"io_uring", inverted}.
inline std::pair<std::string, bool> KeyOfFlag(std::string name) {
  bool inverted = name.rfind("no-", 0) == 0;
  if (inverted) name = name.substr(3);
  std::replace(name.begin(), name.end(), '-', '_');
  return {name, inverted};
}

// The text CLI11 would have got on the command line for a TOML value, or
// an error saying what type the flag takes.
inline absl::StatusOr<std::string> FlagText(const CLI::Option& opt,
                                            const toml::node& n,
                                            bool inverted) {
  const std::string type = opt.get_type_name();
  auto starts = [&](const char* p) { return type.rfind(p, 0) == 0; };
  const bool flag = opt.get_items_expected_max() == 0;  // takes no value
  if (flag || starts("BOOLEAN")) {
    if (n.is_boolean())
      return (*n.value<bool>() != inverted) ? "true" : "false";
    if (!flag && n.is_integer()) return std::to_string(*n.value<int64_t>());
    return absl::InvalidArgumentError("not a boolean");
  }
  if (starts("TEXT")) {
    if (n.is_string()) return *n.value<std::string>();
    return absl::InvalidArgumentError("not a string");
  }
  if (starts("UINT") || starts("INT")) {
    if (!n.is_integer() || (starts("UINT") && *n.value<int64_t>() < 0))
      return absl::InvalidArgumentError(
          starts("UINT") ? "not a non-negative integer" : "not an integer");
    return std::to_string(*n.value<int64_t>());
  }
  if (starts("FLOAT")) {
    if (n.is_integer()) return std::to_string(*n.value<int64_t>());
    if (n.is_floating_point()) return std::to_string(*n.value<double>());
    return absl::InvalidArgumentError("not a number");
  }
  return absl::InvalidArgumentError("not a value of type " + type);
}

}  // namespace config_internal

// Every key of the file `path` (parsed into t) that names a flag of `app`
// sets it as if given on the command line, through the flag's conversion
// and checks, unless the flag itself was given (the command line wins).
// app.count(flag) still says whether the flag was on the command line. A
// key that names no flag nor rules.other_keys is InvalidArgument naming it,
// the file and the nearest valid key; a bad value names the file and key.
[[nodiscard]] inline absl::Status ApplyConfigFile(CLI::App& app,
                                                  const toml::table& t,
                                                  const std::string& path,
                                                  const ConfigKeyRules& rules) {
  std::set<std::string> keys(rules.other_keys.begin(), rules.other_keys.end());
  auto given = [&](const std::string& flag) {
    if (app.count("--" + flag) > 0) return true;
    for (const auto& [alias, of] : rules.aliases)
      if ((alias == "--" + flag && app.count(of) > 0) ||
          (of == "--" + flag && app.count(alias) > 0))
        return true;
    return false;
  };
  // Apply in the flags' order (an alias is declared after its flag).
  std::vector<std::pair<CLI::Option*, std::string>> set;
  for (CLI::Option* opt : app.get_options()) {
    if (opt == app.get_help_ptr() || opt->get_lnames().empty()) continue;
    const std::string& flag = opt->get_lnames().front();
    if (std::count(rules.command_line_only.begin(),
                   rules.command_line_only.end(), "--" + flag))
      continue;
    auto [key, inverted] = config_internal::KeyOfFlag(flag);
    keys.insert(key);
    const toml::node* n = t.get(key);
    if (!n || given(flag)) continue;
    absl::StatusOr<std::string> text =
        config_internal::FlagText(*opt, *n, inverted);
    if (!text.ok())
      return absl::InvalidArgumentError(absl::StrCat(
          "config ", path, ": ", key, ": ", text.status().message()));
    set.emplace_back(opt, *text);
  }
  for (const auto& [k, v] : t) {
    const std::string key(k.str());
    if (keys.count(key)) continue;
    std::string nearest;
    size_t best = SIZE_MAX;
    for (const std::string& valid : keys)
      if (size_t d = config_internal::EditDistance(key, valid); d < best)
        best = d, nearest = valid;
    return absl::InvalidArgumentError(
        absl::StrCat("config ", path, ": unknown key \"", key.substr(0, 64),
                     "\" (did you mean \"", nearest, "\"?)"));
  }
  for (auto& [opt, text] : set) {
    try {
      opt->add_result(text);
      opt->run_callback();
      opt->clear();  // app.count() keeps meaning "on the command line"
    } catch (const CLI::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config ", path, ": ",
          config_internal::KeyOfFlag(opt->get_lnames().front()).first, ": ",
          e.what()));
    }
  }
  return absl::OkStatus();
}

// The keys of `app` and `rules`, one "key --flag" line each (other keys
// alone), sorted: what --print-config-keys prints.
inline std::string ConfigKeyList(const CLI::App& app,
                                 const ConfigKeyRules& rules) {
  std::vector<std::string> lines;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt == app.get_help_ptr() || opt->get_lnames().empty()) continue;
    const std::string& flag = opt->get_lnames().front();
    if (std::count(rules.command_line_only.begin(),
                   rules.command_line_only.end(), "--" + flag))
      continue;
    auto [key, inverted] = config_internal::KeyOfFlag(flag);
    lines.push_back(
        absl::StrCat(key, " --", flag, inverted ? " (inverted)" : ""));
  }
  for (const std::string& k : rules.other_keys) lines.push_back(k);
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, l, "\n");
  return out;
}

}  // namespace ckpt

#endif  // CKPT_UTIL_CONFIG_FILE_H_
