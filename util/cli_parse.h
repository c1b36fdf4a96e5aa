// One way for a binary whose options are parsed by a function returning
// absl::Status to run a CLI11 parse: --help is Cancelled("help") with the
// help text in *help (the caller prints it and exits 0); a parse error is
// InvalidArgument with CLI11's message naming the flag. Header-only.
#ifndef CKPT_UTIL_CLI_PARSE_H_
#define CKPT_UTIL_CLI_PARSE_H_

#include <CLI/CLI.hpp>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace ckpt {

// `args` are what CLI::App::parse takes: (argc, argv) or a vector of words.
template <typename... Args>
[[nodiscard]] absl::Status ParseCli(CLI::App& app, std::string* help,
                                    Args&&... args) {
  try {
    app.parse(std::forward<Args>(args)...);
  } catch (const CLI::CallForHelp&) {
    *help = app.help();
    return absl::CancelledError("help");
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

}  // namespace ckpt

#endif  // CKPT_UTIL_CLI_PARSE_H_
