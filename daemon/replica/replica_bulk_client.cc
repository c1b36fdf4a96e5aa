// The replica transport's caller side (replica_bulk_client.h).
#include "daemon/replica/replica_bulk_client.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/replica/replica_bulk_wire.h"
#include "daemon/replica/replica_client.h"
#include "replica.grpc.pb.h"
#include "util/status.h"

namespace ckpt::daemon {

namespace rv1 = ::ckpt::replica::v1;

namespace {

BulkDeadline ToSteady(std::chrono::system_clock::time_point t) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             t - std::chrono::system_clock::now());
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

// The offer's fields the caller relies on, checked.
absl::Status CheckOffer(const rv1::BulkOffer& offer, std::string_view what) {
  if (offer.token().size() != kBulkTokenBytes)
    return absl::DataLossError(
        absl::StrCat(std::string(what), ": offer.token: ", offer.token().size(),
                     " bytes, expected ", kBulkTokenBytes));
  if (offer.port() == 0 || offer.port() > 65535)
    return absl::DataLossError(absl::StrCat(
        std::string(what), ": offer.port: ", offer.port(), " is not a port"));
  return absl::OkStatus();
}

// Connects, presents the token and waits for the holder's acceptance.
absl::StatusOr<int> OpenBulk(const std::string& host,
                             const rv1::BulkOffer& offer, BulkKind kind,
                             uint64_t bytes, BulkDeadline deadline,
                             std::string_view what,
                             const std::atomic<bool>* cancel = nullptr) {
  CKPT_ASSIGN_OR_RETURN(int fd, ConnectBulk(host, offer.port(), deadline));
  Fd owned{fd};
  BulkHeader h;
  h.kind = kind;
  h.token = offer.token();
  h.length = bytes;
  const auto raw = EncodeBulkHeader(h);
  CKPT_RETURN_IF_ERROR(SendAll(fd, raw.data(), raw.size(), deadline, what,
                               kNoStallLimit, cancel));
  CKPT_RETURN_IF_ERROR(ReadBulkReply(fd, deadline, what, nullptr, cancel));
  owned.fd = -1;
  return fd;
}

absl::StatusOr<uint64_t> BulkPut(grpc::Channel& channel,
                                 const std::string& host,
                                 const rv1::ShardCopy& copy, const char* image,
                                 const PutOptions& options) {
  auto stub = rv1::Replica::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(options.deadline);
  rv1::BulkOffer offer;
  {
    const TransferCancel::Call cancellable(options.cancel, &ctx);
    if (grpc::Status s = stub->OfferPut(&ctx, copy, &offer); !s.ok())
      return FromGrpc(s, "replica offer");
  }
  const std::string what = "replica bulk put";
  CKPT_RETURN_IF_ERROR(CheckOffer(offer, what));
  const BulkDeadline deadline = ToSteady(options.deadline);
  const std::atomic<bool>* cancel =
      options.cancel != nullptr ? options.cancel->flag() : nullptr;
  CKPT_ASSIGN_OR_RETURN(
      int fd, OpenBulk(host, offer, BulkKind::kPut, copy.image_bytes(),
                       deadline, what, cancel));
  Fd owned{fd};
  std::vector<char> damaged;  // test-only: a chunk flipped on the wire
  for (uint64_t off = 0; off < copy.image_bytes();) {
    const uint64_t n = std::min(kBulkIoBytes, copy.image_bytes() - off);
    if (options.limit != nullptr) options.limit->Acquire(n);
    const char* p = image + off;
    if (options.corrupt) {
      damaged.assign(p, p + n);
      damaged[n / 2] ^= 0x5a;
      p = damaged.data();
    }
    CKPT_RETURN_IF_ERROR(
        SendAll(fd, p, n, deadline, what, kNoStallLimit, cancel));
    off += n;
  }
  uint64_t digest = 0;
  CKPT_RETURN_IF_ERROR(ReadBulkReply(fd, deadline, what, &digest, cancel));
  return digest;
}

absl::StatusOr<rv1::ShardCopy> BulkGet(
    grpc::Channel& channel, const std::string& host, const rv1::GetRequest& req,
    const std::function<absl::StatusOr<char*>(const rv1::ShardCopy&)>& dst_for,
    std::chrono::system_clock::time_point deadline) {
  auto stub = rv1::Replica::NewStub(
      std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  rv1::BulkOffer offer;
  if (grpc::Status s = stub->OfferGet(&ctx, req, &offer); !s.ok())
    return FromGrpc(s, "replica offer");
  const std::string what = "replica bulk get";
  CKPT_RETURN_IF_ERROR(CheckOffer(offer, what));
  if (!offer.has_copy())
    return absl::DataLossError("replica bulk get: offer.copy: missing");
  // The slot is taken once the size is known (the arena may be created
  // now); the token outlives that.
  CKPT_ASSIGN_OR_RETURN(char* dst, dst_for(offer.copy()));
  const BulkDeadline steady = ToSteady(deadline);
  CKPT_ASSIGN_OR_RETURN(
      int fd, OpenBulk(host, offer, BulkKind::kGet, offer.copy().image_bytes(),
                       steady, what));
  Fd owned{fd};
  CKPT_RETURN_IF_ERROR(
      RecvAll(fd, dst, offer.copy().image_bytes(), steady, what));
  CKPT_RETURN_IF_ERROR(ReadBulkReply(fd, steady, what, nullptr));
  return offer.copy();
}

// A ckptd from before the bulk path (a rolling upgrade) has no OfferPut or
// OfferGet: gRPC answers UNIMPLEMENTED, and the copy goes over the gRPC
// stream instead, as that holder expects.
bool FromOlderHolder(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnimplemented;
}

}  // namespace

absl::StatusOr<uint64_t> SendReplica(
    ReplicaTransport transport, grpc::Channel& channel, const std::string& host,
    const rv1::ShardCopy& copy, const char* image, const PutOptions& options) {
  if (transport == ReplicaTransport::kGrpc)
    return PutReplica(channel, copy, image, options);
  absl::StatusOr<uint64_t> sent = BulkPut(channel, host, copy, image, options);
  if (FromOlderHolder(sent.status()))
    return PutReplica(channel, copy, image, options);
  return sent;
}

absl::StatusOr<rv1::ShardCopy> FetchReplica(
    ReplicaTransport transport, grpc::Channel& channel, const std::string& host,
    const rv1::GetRequest& req,
    const std::function<absl::StatusOr<char*>(const rv1::ShardCopy&)>& dst_for,
    std::chrono::system_clock::time_point deadline) {
  if (transport == ReplicaTransport::kGrpc)
    return GetReplica(channel, req, dst_for, deadline);
  absl::StatusOr<rv1::ShardCopy> got =
      BulkGet(channel, host, req, dst_for, deadline);
  // dst_for was not called: the offer comes first.
  if (FromOlderHolder(got.status()))
    return GetReplica(channel, req, dst_for, deadline);
  return got;
}

}  // namespace ckpt::daemon
