// The Ckptd gRPC service: looks up the caller's credentials (see
// PeerListener) and forwards each call to the Engine, turning absl::Status
// into grpc::Status one to one. Thread-safe.
#ifndef CKPT_DAEMON_SERVICE_H_
#define CKPT_DAEMON_SERVICE_H_

#include "ckpt.grpc.pb.h"
#include "daemon/engine.h"
#include "daemon/peer_listener.h"

namespace ckpt::daemon {

class CkptdService final : public v1::Ckptd::Service {
 public:
  CkptdService(Engine* engine, const PeerListener* listener, std::string root)
      : engine_(engine), listener_(listener), root_(std::move(root)) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*,
                        v1::RegisterResponse*) override;
  grpc::Status BeginSave(grpc::ServerContext*, const v1::BeginSaveRequest*,
                         v1::BeginSaveResponse*) override;
  grpc::Status CommitSave(grpc::ServerContext*, const v1::CommitSaveRequest*,
                          v1::CommitSaveResponse*) override;
  grpc::Status AbortSave(grpc::ServerContext*, const v1::AbortSaveRequest*,
                         v1::AbortSaveResponse*) override;
  grpc::Status Latest(grpc::ServerContext*, const v1::LatestRequest*,
                      v1::LatestResponse*) override;
  grpc::Status OpenRestore(grpc::ServerContext*, const v1::OpenRestoreRequest*,
                           v1::OpenRestoreResponse*) override;
  grpc::Status CloseRestore(grpc::ServerContext*, const v1::CloseRestoreRequest*,
                            v1::CloseRestoreResponse*) override;
  grpc::Status WaitDurable(grpc::ServerContext*, const v1::WaitDurableRequest*,
                           v1::WaitDurableResponse*) override;
  grpc::Status List(grpc::ServerContext*, const v1::ListRequest*, v1::ListResponse*) override;
  grpc::Status Delete(grpc::ServerContext*, const v1::DeleteRequest*,
                      v1::DeleteResponse*) override;
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusResponse*) override;

 private:
  template <typename Req, typename Resp, typename Fn>
  grpc::Status Call(grpc::ServerContext* ctx, const Req* req, Resp* resp, Fn fn);

  Engine* const engine_;
  const PeerListener* const listener_;
  const std::string root_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVICE_H_
