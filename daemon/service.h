// The Ckptd gRPC service: checks every request field that can be checked
// without state (names, counts, sizes) before anything else, looks up the
// caller's credentials (see PeerListener) and forwards each call to the
// Engine, turning absl::Status into grpc::Status one to one. A request that
// does not parse, or a field it refuses, is INVALID_ARGUMENT naming the
// field and quoting at most a short prefix of the value (see RpcService,
// util/validate.h). Thread-safe.
#ifndef CKPT_DAEMON_SERVICE_H_
#define CKPT_DAEMON_SERVICE_H_

#include "ckpt.grpc.pb.h"
#include "daemon/engine/engine.h"
#include "daemon/peer_listener.h"
#include "util/rpc_service.h"

namespace ckpt::daemon {

class CkptdService final : public rpc::RpcService {
 public:
  CkptdService(Engine* engine, const PeerListener* listener, std::string root);

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest*,
                        v1::RegisterResponse*);
  grpc::Status BeginSave(grpc::ServerContext*, const v1::BeginSaveRequest*,
                         v1::BeginSaveResponse*);
  grpc::Status CommitSave(grpc::ServerContext*, const v1::CommitSaveRequest*,
                          v1::CommitSaveResponse*);
  grpc::Status AbortSave(grpc::ServerContext*, const v1::AbortSaveRequest*,
                         v1::AbortSaveResponse*);
  grpc::Status Latest(grpc::ServerContext*, const v1::LatestRequest*,
                      v1::LatestResponse*);
  grpc::Status OpenRestore(grpc::ServerContext*, const v1::OpenRestoreRequest*,
                           v1::OpenRestoreResponse*);
  grpc::Status OpenRestoreStream(grpc::ServerContext*,
                                 const v1::OpenRestoreRequest*,
                                 grpc::ServerWriter<v1::RestoreProgress>*);
  grpc::Status LayoutIndex(grpc::ServerContext*, const v1::LayoutIndexRequest*,
                           v1::LayoutIndexResponse*);
  grpc::Status CloseRestore(grpc::ServerContext*,
                            const v1::CloseRestoreRequest*,
                            v1::CloseRestoreResponse*);
  grpc::Status WaitDurable(grpc::ServerContext*, const v1::WaitDurableRequest*,
                           v1::WaitDurableResponse*);
  grpc::Status List(grpc::ServerContext*, const v1::ListRequest*,
                    v1::ListResponse*);
  grpc::Status Delete(grpc::ServerContext*, const v1::DeleteRequest*,
                      v1::DeleteResponse*);
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*,
                      v1::StatusResponse*);

 private:
  template <typename Req, typename Resp, typename Fn>
  grpc::Status Call(grpc::ServerContext* ctx, const Req* req, Resp* resp,
                    Fn fn);

  Engine* const engine_;
  const PeerListener* const listener_;
  const std::string root_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVICE_H_
