#include "coordinator/client/leader_channel.h"

#include "absl/strings/str_split.h"
#include "util/retry.h"

namespace ckpt::coordinator {
namespace {
constexpr std::string_view kLeaderIs = "not leader; leader is ";
}  // namespace

absl::StatusOr<std::vector<std::string>> ParseAddressList(
    const std::string& list, std::string_view flag) {
  std::vector<std::string> out;
  for (absl::string_view a : absl::StrSplit(list, ',')) {
    std::string addr(a);
    absl::Status s = ValidateHostPort(addr, flag);
    if (!s.ok()) return s;
    out.push_back(std::move(addr));
  }
  return out;
}

std::string LeaderHint(
    const grpc::Status& s,
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers) {
  if (s.ok()) return "";
  auto it = trailers.find(kLeaderMetadataKey);
  if (it != trailers.end() && it->second.size() > 0)
    return std::string(it->second.data(), it->second.size());
  return LeaderHint(s);
}

std::string LeaderHint(const grpc::Status& s, const grpc::ClientContext& ctx) {
  return LeaderHint(s, ctx.GetServerTrailingMetadata());
}

std::string LeaderHint(const grpc::Status& s) {
  const std::string& m = s.error_message();
  size_t at = m.find(kLeaderIs);
  if (at == std::string::npos) return "";
  std::string rest = m.substr(at + kLeaderIs.size());
  size_t end = rest.find_first_of(" ;,)");
  return end == std::string::npos ? rest : rest.substr(0, end);
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Create(
    const std::string& addresses, const TlsFiles& tls) {
  absl::StatusOr<std::vector<std::string>> list =
      ParseAddressList(addresses, "--coordinator");
  if (!list.ok()) return list.status();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds =
      LoadClientCredentials(tls);
  if (!creds.ok()) return creds.status();
  std::unique_ptr<CoordinatorClient> c(new CoordinatorClient);
  c->addresses_ = std::move(*list);
  c->tls_ = tls.enabled();
  for (const std::string& a : c->addresses_) {
    std::shared_ptr<grpc::Channel> ch =
        NewCoordinatorChannel(a, *creds, tls.enabled());
    c->stubs_.push_back(coord::v1::Coordinator::NewStub(ch));
    c->watch_stubs_.push_back(coord::v1::CoordinatorWatch::NewStub(ch));
  }
  return c;
}

grpc::Status CoordinatorClient::WithHint(const grpc::Status& s) const {
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE ||
      !LeaderHint(s).empty() ||
      s.error_message().find("not leader") != std::string::npos)
    return s;
  return grpc::Status(
      s.error_code(),
      s.error_message() +
          (tls_ ? " (if the coordinator is up, it may have refused this "
                  "client's certificate: check that "
                  "--tls-cert is signed by the coordinator's CA and --tls-ca "
                  "is that CA)"
                : " (if the coordinator is up and uses TLS, give --tls-cert, "
                  "--tls-key and --tls-ca)"));
}

bool CoordinatorClient::Retry(const grpc::Status& s) const {
  if (stubs_.size() < 2) return false;
  return IsUnreachable(s);  // a busy leader is not a reason to fail over
}

size_t CoordinatorClient::NextIndex(const std::string& leader,
                                    size_t idx) const {
  for (size_t i = 0; !leader.empty() && i < addresses_.size(); ++i)
    if (addresses_[i] == leader && i != idx) return i;
  return (idx + 1) % addresses_.size();
}

}  // namespace ckpt::coordinator
