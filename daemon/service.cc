#include "daemon/service.h"

#include "absl/strings/str_format.h"
#include "ckpt/tensor.h"
#include "storage/layout.h"
#include "storage/shard_format.h"
#include "util/checksum.h"
#include "util/validate.h"

namespace ckpt::daemon {
namespace {

// Field checks that need no state, run before anything else so that a huge
// or malformed field costs nothing and is never echoed whole.
// Register, BeginSave, AbortSave, Latest, OpenRestore, CloseRestore,
// WaitDurable, Delete, LayoutIndex: the job is their only name.
template <typename Req>
[[nodiscard]] absl::Status CheckFields(const Req& r) {
  return ValidateJobName(r.job());
}
[[nodiscard]] absl::Status CheckFields(const v1::ListRequest& r) {
  return r.job().empty() ? absl::OkStatus() : ValidateJobName(r.job());
}
[[nodiscard]] absl::Status CheckFields(const v1::StatusRequest&) {
  return absl::OkStatus();
}
[[nodiscard]] absl::Status CheckFields(const v1::CommitSaveRequest& r) {
  if (absl::Status s = ValidateJobName(r.job()); !s.ok()) return s;
  if (static_cast<size_t>(r.tensors_size()) > storage::kMaxShardTensors)
    return absl::InvalidArgumentError(
        absl::StrFormat("tensors: %d, at most %d allowed", r.tensors_size(),
                        storage::kMaxShardTensors));
  for (int i = 0; i < r.tensors_size(); ++i) {
    const v1::TensorMeta& t = r.tensors(i);
    // The field's full name is only built for a refusal (the hot path
    // commits thousands of tensors).
    if (!ValidateTensorName(t.name(), "name").ok())
      return ValidateTensorName(t.name(),
                                absl::StrFormat("tensors[%d].name", i));
    if (static_cast<size_t>(t.shape_size()) > kMaxTensorDims)
      return absl::InvalidArgumentError(
          absl::StrFormat("tensors[%d].shape: %d dims, at most %d allowed", i,
                          t.shape_size(), kMaxTensorDims));
    // Chunk hashes: one per chunk, combining into the checksum, or none.
    if (t.chunk_hashes_size() != 0) {
      if (static_cast<uint64_t>(t.chunk_hashes_size()) !=
              ChecksumChunks(t.bytes()) ||
          !t.has_checksum())
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensors[%d].chunk_hashes: %d hashes, %d bytes have %d chunks%s", i,
            t.chunk_hashes_size(), t.bytes(), ChecksumChunks(t.bytes()),
            t.has_checksum() ? "" : " (and no checksum)"));
      if (CombineChunkHashes(std::span<const uint64_t>(
              t.chunk_hashes().data(), t.chunk_hashes_size())) != t.checksum())
        return absl::InvalidArgumentError(absl::StrFormat(
            "tensors[%d].chunk_hashes: they do not combine into checksum "
            "%016x",
            i, t.checksum()));
    }
    // Where the piece sits in its global tensor (doc/resharding.md): only
    // tensors that say so pay for the check.
    if (t.global_shape_size() != 0 || t.piece_offsets_size() != 0 ||
        !t.global_name().empty()) {
      if (absl::Status s = storage::ValidateTensorLayout(
              t, absl::StrFormat("tensors[%d]", i));
          !s.ok())
        return s;
    }
  }
  return absl::OkStatus();
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

template <typename T>
grpc::Status Fill(absl::StatusOr<T> r, T* out) {
  if (!r.ok()) return ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace

CkptdService::CkptdService(Engine* engine, const PeerListener* listener,
                           std::string root)
    : RpcService(
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
              v1::Ckptd::service_full_name())),
      engine_(engine),
      listener_(listener),
      root_(std::move(root)) {
  AddUnary("Register", this, &CkptdService::Register);
  AddUnary("BeginSave", this, &CkptdService::BeginSave);
  AddUnary("CommitSave", this, &CkptdService::CommitSave);
  AddUnary("AbortSave", this, &CkptdService::AbortSave);
  AddUnary("Latest", this, &CkptdService::Latest);
  AddUnary("OpenRestore", this, &CkptdService::OpenRestore);
  AddUnary("CloseRestore", this, &CkptdService::CloseRestore);
  AddUnary("WaitDurable", this, &CkptdService::WaitDurable);
  AddUnary("List", this, &CkptdService::List);
  AddUnary("Delete", this, &CkptdService::Delete);
  AddUnary("Status", this, &CkptdService::Status);
  AddUnary("LayoutIndex", this, &CkptdService::LayoutIndex);
}

template <typename Req, typename Resp, typename Fn>
grpc::Status CkptdService::Call(grpc::ServerContext* ctx, const Req* req,
                                Resp* /*resp*/, Fn fn) {
  if (absl::Status s = CheckFields(*req); !s.ok()) return ToGrpc(s);
  std::optional<PeerCreds> peer = listener_->Lookup(ctx->peer());
  if (!peer)
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        "caller's credentials are unknown (connect over the Unix socket)");
  return fn(*peer);
}

#define CKPT_FORWARD_OR(Method, Req, Resp)                                \
  grpc::Status CkptdService::Method(grpc::ServerContext* ctx,             \
                                    const v1::Req* req, v1::Resp* resp) { \
    return Call(ctx, req, resp, [&](const PeerCreds& p) {                 \
      return Fill(engine_->Method(p, *req), resp);                        \
    });                                                                   \
  }
#define CKPT_FORWARD_S(Method, Req, Resp)                                 \
  grpc::Status CkptdService::Method(grpc::ServerContext* ctx,             \
                                    const v1::Req* req, v1::Resp* resp) { \
    return Call(ctx, req, resp, [&](const PeerCreds& p) {                 \
      return ToGrpc(engine_->Method(p, *req));                            \
    });                                                                   \
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
CKPT_FORWARD_OR(LayoutIndex, LayoutIndexRequest, LayoutIndexResponse)

grpc::Status CkptdService::Status(grpc::ServerContext* ctx,
                                  const v1::StatusRequest* req,
                                  v1::StatusResponse* resp) {
  return Call(ctx, req, resp, [&](const PeerCreds& peer) {
    *resp = engine_->Status(peer);
    resp->set_root(root_);
    resp->set_version(CKPTD_VERSION);
    return grpc::Status::OK;
  });
}

}  // namespace ckpt::daemon
