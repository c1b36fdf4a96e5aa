#include "coordinator/etcd/etcd_state.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/channel.h"

namespace ckpt::coordinator::etcd {

bool IsEtcdState(const std::string& state) {
  return state.rfind("etcd://", 0) == 0;
}

absl::StatusOr<EtcdState> ParseEtcdState(const std::string& state,
                                         const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " \"", state.substr(0, 80), "\": ", why,
                     " (expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX)"));
  };
  if (!IsEtcdState(state)) return bad("not an etcd:// URL");
  std::string rest = state.substr(7);
  size_t slash = rest.find('/');
  if (slash == std::string::npos) return bad("no /PREFIX");
  EtcdState out;
  std::string prefix = rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty()) return bad("empty PREFIX");
  for (char c : prefix)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
          c == '-' || c == '/'))
      return bad("PREFIX may hold only [A-Za-z0-9._/-]");
  out.prefix = "/" + prefix + "/";
  for (absl::string_view ep : absl::StrSplit(rest.substr(0, slash), ',')) {
    absl::Status s = ValidateHostPort(std::string(ep), flag + " endpoint");
    if (!s.ok()) return s;
    out.endpoints.emplace_back(ep);
  }
  return out;
}

}  // namespace ckpt::coordinator::etcd
