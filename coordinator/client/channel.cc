#include "coordinator/client/channel.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator {

absl::Status ValidateHostPort(const std::string& addr, std::string_view flag,
                              int min_port) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(flag), " \"", addr, "\": ", std::string(why),
                     " (expected HOST:PORT)"));
  };
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  std::string host = addr.substr(0, colon);
  std::string port = addr.substr(colon + 1);
  if (host.empty() || host == "[]") return bad("empty host");
  if (host.front() == '[' ? host.back() != ']'
                          : host.find(':') != std::string::npos)
    return bad("an IPv6 host must be in brackets");
  for (char c : host)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '/')
      return bad("bad character in host");
  const std::string range = absl::StrCat("port not in [", min_port, ", 65535]");
  if (port.empty() || port.size() > 5) return bad(range);
  for (char c : port)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      return bad("port is not a number");
  int value = std::stoi(port);
  if (value < min_port || value > 65535) return bad(range);
  return absl::OkStatus();
}

std::unique_ptr<coord::v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& addr) {
  return NewCoordinatorStub(addr, grpc::InsecureChannelCredentials(),
                            /*tls=*/false);
}

std::unique_ptr<coord::v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& addr,
    const std::shared_ptr<grpc::ChannelCredentials>& creds, bool tls) {
  return coord::v1::Coordinator::NewStub(
      NewCoordinatorChannel(addr, creds, tls));
}

std::shared_ptr<grpc::Channel> NewCoordinatorChannel(
    const std::string& addr,
    const std::shared_ptr<grpc::ChannelCredentials>& creds, bool tls) {
  grpc::ChannelArguments args;
  // A step's layout index (StepIndex) grows with its pieces: about 12
  // bytes each, 200 MB for 16,384 ranks x 1,000 tensors.
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // This also bounds each connection attempt: a busy coordinator may send
  // its HTTP/2 SETTINGS later than 100 ms (one under ASan did, and the
  // call failed at once), so an attempt may take up to 1 s; a TLS
  // handshake keeps gRPC's default.
  if (!tls) args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // After a lost connection the channel re-resolves the name before it
  // reconnects; at the default rate limit (30 s) calls wait for that.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 500);
  return grpc::CreateCustomChannel(addr, creds, args);
}

void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

absl::Status CoordStatus(const grpc::Status& s, std::string_view rpc,
                         const std::string& addr) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(std::string(rpc), " to coordinator ", addr,
                                   ": ", s.error_message()));
}

}  // namespace ckpt::coordinator
