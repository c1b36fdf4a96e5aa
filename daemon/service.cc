#include "daemon/service.h"

namespace ckpt::daemon {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

template <typename T>
grpc::Status Fill(absl::StatusOr<T> r, T* out) {
  if (!r.ok()) return ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace

template <typename Req, typename Resp, typename Fn>
grpc::Status CkptdService::Call(grpc::ServerContext* ctx, const Req* req, Resp* resp, Fn fn) {
  std::optional<PeerCreds> peer = listener_->Lookup(ctx->peer());
  if (!peer)
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "caller's credentials are unknown (connect over the Unix socket)");
  return fn(*peer);
}

#define CKPT_FORWARD_OR(Method, Req, Resp)                                          \
  grpc::Status CkptdService::Method(grpc::ServerContext* ctx, const v1::Req* req,   \
                                    v1::Resp* resp) {                               \
    return Call(ctx, req, resp,                                                     \
                [&](const PeerCreds& p) { return Fill(engine_->Method(p, *req), resp); }); \
  }
#define CKPT_FORWARD_S(Method, Req, Resp)                                          \
  grpc::Status CkptdService::Method(grpc::ServerContext* ctx, const v1::Req* req,  \
                                    v1::Resp* resp) {                              \
    return Call(ctx, req, resp,                                                    \
                [&](const PeerCreds& p) { return ToGrpc(engine_->Method(p, *req)); }); \
  }

CKPT_FORWARD_OR(Register, RegisterRequest, RegisterResponse)
CKPT_FORWARD_OR(BeginSave, BeginSaveRequest, BeginSaveResponse)
CKPT_FORWARD_S(CommitSave, CommitSaveRequest, CommitSaveResponse)
CKPT_FORWARD_S(AbortSave, AbortSaveRequest, AbortSaveResponse)
CKPT_FORWARD_OR(Latest, LatestRequest, LatestResponse)
CKPT_FORWARD_OR(OpenRestore, OpenRestoreRequest, OpenRestoreResponse)
CKPT_FORWARD_S(CloseRestore, CloseRestoreRequest, CloseRestoreResponse)
CKPT_FORWARD_S(WaitDurable, WaitDurableRequest, WaitDurableResponse)
CKPT_FORWARD_OR(List, ListRequest, ListResponse)
CKPT_FORWARD_OR(Delete, DeleteRequest, DeleteResponse)

grpc::Status CkptdService::Status(grpc::ServerContext* ctx, const v1::StatusRequest* req,
                                  v1::StatusResponse* resp) {
  return Call(ctx, req, resp, [&](const PeerCreds& peer) {
    *resp = engine_->Status(peer);
    resp->set_root(root_);
    resp->set_version(CKPTD_VERSION);
    return grpc::Status::OK;
  });
}

}  // namespace ckpt::daemon
