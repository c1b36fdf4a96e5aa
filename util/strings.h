// Small string helpers every folder uses. Functions only; thread-safe.
// (QuotePrefix, the bounded quote of an untrusted value in an error
// message, is in util/validate.h with the validators.)
#ifndef CKPT_UTIL_STRINGS_H_
#define CKPT_UTIL_STRINGS_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace ckpt {

// std::string_view as absl::string_view. Debian's absl (20220623) is built
// with ABSL_OPTION_USE_STD_STRING_VIEW 0: its string_view is a type of its
// own, so absl::StrCat, StrFormat and friends take a std::string_view only
// through this.
inline absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace ckpt

#endif  // CKPT_UTIL_STRINGS_H_
