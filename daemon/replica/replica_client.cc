// Put, Get and the sender's rate limit (replica_client.h).
#include "daemon/replica/replica_client.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/replica/replica_service.h"
#include "replica.grpc.pb.h"

namespace ckpt::daemon {

namespace rv1 = ::ckpt::replica::v1;

absl::Status FromGrpc(const grpc::Status& s, std::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(std::string(what), ": ", s.error_message()));
}

void TransferCancel::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

void TransferCancel::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = false;
}

TransferCancel::Call::Call(TransferCancel* cancel, grpc::ClientContext* ctx)
    : cancel_(cancel) {
  if (cancel_ == nullptr) return;
  std::lock_guard<std::mutex> lock(cancel_->mu_);
  cancel_->call_ = ctx;
  // Cancelled before the call began: gRPC ends it as soon as it starts.
  if (cancel_->cancelled_) ctx->TryCancel();
}

TransferCancel::Call::~Call() {
  if (cancel_ == nullptr) return;
  std::lock_guard<std::mutex> lock(cancel_->mu_);
  cancel_->call_ = nullptr;
}

void RateLimiter::Acquire(uint64_t bytes) {
  if (rate_ == 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (last_ == std::chrono::steady_clock::time_point{}) {
    last_ = now;
    tokens_ = static_cast<double>(rate_);  // one second of burst to start
  }
  tokens_ = std::min<double>(
      static_cast<double>(rate_),
      tokens_ + std::chrono::duration<double>(now - last_).count() *
                    static_cast<double>(rate_));
  last_ = now;
  tokens_ -= static_cast<double>(bytes);
  if (tokens_ >= 0) return;
  // The debt is paid by sleeping; others queue behind this lock.
  std::this_thread::sleep_for(
      std::chrono::duration<double>(-tokens_ / static_cast<double>(rate_)));
}

absl::StatusOr<uint64_t> PutReplica(grpc::Channel& channel,
                                    const rv1::ShardCopy& copy,
                                    const char* image,
                                    const PutOptions& options) {
  auto stub = rv1::Replica::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(options.deadline);
  const TransferCancel::Call cancellable(options.cancel, &ctx);
  rv1::PutResponse resp;
  std::unique_ptr<grpc::ClientWriter<rv1::PutChunk>> writer =
      stub->Put(&ctx, &resp);
  rv1::PutChunk chunk;
  *chunk.mutable_copy() = copy;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min(kReplicaChunkBytes, copy.image_bytes() - off);
    if (options.limit != nullptr) options.limit->Acquire(n);
    chunk.set_offset(off);
    chunk.set_data(image + off, n);
    if (options.corrupt && n > 0) (*chunk.mutable_data())[n / 2] ^= 0x5a;
    if (!writer->Write(chunk)) break;  // the holder ended it: Finish says why
    chunk.clear_copy();
    off += n;
  } while (off < copy.image_bytes());
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return FromGrpc(s, "replica put");
  return resp.checksum_digest();
}

absl::StatusOr<rv1::ShardCopy> GetReplica(
    grpc::Channel& channel, const rv1::GetRequest& req,
    const std::function<absl::StatusOr<char*>(const rv1::ShardCopy&)>& dst_for,
    std::chrono::system_clock::time_point deadline) {
  auto stub = rv1::Replica::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  std::unique_ptr<grpc::ClientReader<rv1::GetChunk>> reader =
      stub->Get(&ctx, req);
  rv1::GetChunk chunk;
  rv1::ShardCopy copy;
  char* dst = nullptr;
  uint64_t got = 0;
  absl::Status bad;
  while (bad.ok() && reader->Read(&chunk)) {
    if (dst == nullptr) {
      if (!chunk.has_copy()) {
        bad = absl::DataLossError(
            "replica get: copy: the first chunk does not describe the copy");
        break;
      }
      copy = chunk.copy();
      absl::StatusOr<char*> where = dst_for(copy);
      if (!where.ok()) {
        bad = where.status();
        break;
      }
      dst = *where;
    }
    if (chunk.offset() != got ||
        chunk.data().size() > copy.image_bytes() - got) {
      bad = absl::DataLossError(absl::StrCat(
          "replica get: offset ", chunk.offset(), " with ", chunk.data().size(),
          " bytes after ", got, " of ", copy.image_bytes()));
      break;
    }
    std::memcpy(dst + got, chunk.data().data(), chunk.data().size());
    got += chunk.data().size();
  }
  if (!bad.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();  // cancelled: its status is ours
    return bad;
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpc(s, "replica get");
  if (dst == nullptr || got != copy.image_bytes())
    return absl::DataLossError(absl::StrCat(
        "replica get: ", got, " bytes arrived of ", copy.image_bytes()));
  return copy;
}

}  // namespace ckpt::daemon
