// A client's connection to the coordinator (ckpt.coord.v1 over TCP), shared
// by ckptd's node agent, ckptctl's coordinator commands and ckptrun: address
// validation, a stub whose channel reconnects quickly after the coordinator
// restarts, per-call deadlines, and grpc::Status -> absl::Status with the RPC
// and address in the message. Functions only; thread-safe.
#ifndef CKPT_COORDINATOR_CLIENT_CHANNEL_H_
#define CKPT_COORDINATOR_CLIENT_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "coordinator.grpc.pb.h"

namespace ckpt::coordinator {

// "HOST:PORT" (HOST may be "[v6]") with a non-empty host and a port in
// [min_port, 65535] (0 lets a server pick a free port); otherwise
// InvalidArgument naming `flag`.
[[nodiscard]] absl::Status ValidateHostPort(const std::string& addr,
                                            std::string_view flag,
                                            int min_port = 1);

// A stub for `addr` (already validated). Reconnect attempts after a refused
// connection are at most 1 s apart, so a restarted coordinator is seen soon.
std::unique_ptr<coord::v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& addr);
// The same over `creds` (TLS: coordinator/client/tls.h; `tls` says whether
// they are TLS credentials).
std::unique_ptr<coord::v1::Coordinator::Stub> NewCoordinatorStub(
    const std::string& addr,
    const std::shared_ptr<grpc::ChannelCredentials>& creds, bool tls);
// The channel those stubs use (for the CoordinatorWatch stub too).
std::shared_ptr<grpc::Channel> NewCoordinatorChannel(
    const std::string& addr,
    const std::shared_ptr<grpc::ChannelCredentials>& creds, bool tls);

void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout);

// "RPC to ADDR: message", same code; OK stays OK.
[[nodiscard]] absl::Status CoordStatus(const grpc::Status& s,
                                       std::string_view rpc,
                                       const std::string& addr);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_CLIENT_CHANNEL_H_
