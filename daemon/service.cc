#include "daemon/service.h"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

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

// An OpenRestoreStream's load progress, written to the stream by a thread
// of its own (started with the load), so that the reading threads that
// report it never wait on the socket.
class StreamedProgress final : public Restorer::LoadProgress {
 public:
  explicit StreamedProgress(grpc::ServerWriter<v1::RestoreProgress>* writer)
      : writer_(writer) {}
  ~StreamedProgress() override { Finish(); }

  void Started(v1::OpenRestoreResponse where) override {
    std::lock_guard<std::mutex> l(mu_);
    opened_ = std::move(where);
    has_opened_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    cv_.notify_one();
  }
  void Verified(uint32_t tensor) override {
    std::lock_guard<std::mutex> l(mu_);
    verified_.push_back(tensor);
    cv_.notify_one();
  }
  // Writes what is pending and stops the thread; false if a write failed
  // (the client went away).
  bool Finish() {
    {
      std::lock_guard<std::mutex> l(mu_);
      finish_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    return !broken_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return finish_ || has_opened_ || !verified_.empty(); });
      if (!has_opened_ && verified_.empty()) return;  // finish_
      v1::RestoreProgress msg;
      if (has_opened_) *msg.mutable_opened() = std::move(opened_);
      has_opened_ = false;
      for (uint32_t t : verified_) msg.add_verified(t);
      verified_.clear();
      l.unlock();
      const bool wrote = broken_ || writer_->Write(msg);
      l.lock();
      if (!wrote) broken_ = true;
    }
  }

  grpc::ServerWriter<v1::RestoreProgress>* const writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  v1::OpenRestoreResponse opened_;  // guarded by mu_
  bool has_opened_ = false;         // guarded by mu_
  std::vector<uint32_t> verified_;  // guarded by mu_
  bool finish_ = false;             // guarded by mu_
  bool broken_ = false;             // guarded by mu_ (read after the join)
  std::thread thread_;
};

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
  AddServerStreaming("OpenRestoreStream", this,
                     &CkptdService::OpenRestoreStream);
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

grpc::Status CkptdService::OpenRestoreStream(
    grpc::ServerContext* ctx, const v1::OpenRestoreRequest* req,
    grpc::ServerWriter<v1::RestoreProgress>* writer) {
  v1::RestoreProgress* none = nullptr;
  return Call(ctx, req, none, [&](const PeerCreds& p) {
    StreamedProgress progress(writer);
    absl::StatusOr<v1::OpenRestoreResponse> r =
        engine_->OpenRestore(p, *req, &progress);
    const bool wrote = progress.Finish();
    if (!r.ok()) return ToGrpc(r.status());
    const uint64_t lease = r->lease();
    v1::RestoreProgress last;
    *last.mutable_done() = std::move(*r);
    if (wrote && writer->Write(last)) return grpc::Status::OK;
    // The client went away: its lease goes now, not at its exit.
    if (lease != 0) {
      v1::CloseRestoreRequest close;
      close.set_job(req->job());
      close.set_rank(req->has_saved_rank() ? req->saved_rank() : req->rank());
      close.set_lease(lease);
      (void)engine_->CloseRestore(p, close);
    }
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "OpenRestoreStream: the client went away");
  });
}
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
