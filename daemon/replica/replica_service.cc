// ReplicaServer (replica_service.h): Put and Get on the replica listener.
#include "daemon/replica/replica_service.h"

#include <grpcpp/security/auth_context.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/replica/ranged_read.h"
#include "replica.grpc.pb.h"
#include "storage/shard_image.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

namespace rv1 = ::ckpt::replica::v1;

namespace {

constexpr int kHttp2FrameBytes = (1 << 24) - 1;  // HTTP/2's largest
constexpr int kHttp2WindowBytes = 64 << 20;

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

// The caller's certificate identities (CN and subjectAltNames); empty
// without TLS.
std::vector<std::string> Identities(const grpc::ServerContext& ctx) {
  std::vector<std::string> ids;
  auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return ids;
  for (const char* prop : {"x509_common_name", "x509_subject_alternative_name"})
    for (const grpc::string_ref& v : auth->FindPropertyValues(prop))
      ids.emplace_back(v.data(), v.size());
  return ids;
}

// Streams `bytes` of `image` after the copy's description.
template <typename Writer>
bool StreamImage(Writer* writer, const rv1::ShardCopy& copy,
                 const char* image) {
  rv1::GetChunk chunk;
  *chunk.mutable_copy() = copy;
  uint64_t off = 0;
  do {
    const uint64_t n = std::min(kReplicaChunkBytes, copy.image_bytes() - off);
    chunk.set_offset(off);
    chunk.set_data(image + off, n);
    if (!writer->Write(chunk)) return false;
    chunk.clear_copy();
    off += n;
  } while (off < copy.image_bytes());
  return true;
}

// A ranged read's answer (ranged_read.h): the copy's description and the
// save's chunk hashes of every tensor the ranges touch (the stored ones
// where `stored` has them, else hashed here from the image), then the
// image's header and index, the touched chunks and the footer, in image
// order. The reader verifies it all; this only refuses a bad request.
template <typename Writer>
grpc::Status StreamRanges(Writer* writer, const rv1::RangeRequest& req,
                          const rv1::ShardCopy& copy, const char* image,
                          const std::vector<std::vector<uint64_t>>* stored) {
  auto invalid = [](const absl::Status& s) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                        std::string(s.message()));
  };
  absl::StatusOr<std::vector<ImageRange>> ranges = ValidateRanges(
      std::span<const uint64_t>(req.offsets().data(), req.offsets_size()),
      std::span<const uint64_t>(req.lengths().data(), req.lengths_size()),
      copy.image_bytes(), "ranges");
  if (!ranges.ok()) return invalid(ranges.status());
  absl::StatusOr<storage::ShardInfo> info = storage::ValidateImage(
      {image, copy.image_bytes()}, {copy.job(), copy.step(), copy.rank()},
      "the image here");
  if (!info.ok()) return invalid(info.status());
  absl::StatusOr<storage::ShardHeader> header =
      storage::DecodeHeader({image, storage::kShardAlign});
  if (!header.ok()) return invalid(header.status());
  const std::vector<TouchedChunk> chunks = TouchedChunks(*info, *ranges);
  rv1::RangeChunk msg;
  *msg.mutable_copy() = copy;
  for (size_t i = 0; i < chunks.size();) {
    const uint32_t t = chunks[i].tensor;
    const storage::ShardTensor& x = info->tensors[t];
    rv1::TensorChunkHashes* h = msg.add_hashes();
    h->set_tensor(t);
    const uint64_t n = ChecksumChunks(x.bytes);
    if (stored != nullptr && t < stored->size() && (*stored)[t].size() == n) {
      h->mutable_hashes()->Add((*stored)[t].begin(), (*stored)[t].end());
    } else {
      for (uint64_t c = 0; c < n; ++c) {
        const uint64_t at = c * kChecksumChunk;
        h->add_hashes(Hash64(image + x.offset + at,
                             std::min(kChecksumChunk, x.bytes - at)));
      }
    }
    while (i < chunks.size() && chunks[i].tensor == t) ++i;
  }
  auto send = [&](uint64_t at, uint64_t bytes) {
    for (uint64_t off = at; off < at + bytes;) {
      const uint64_t n = std::min(kReplicaChunkBytes, at + bytes - off);
      msg.set_offset(off);
      msg.set_data(image + off, n);
      if (!writer->Write(msg)) return false;
      msg.clear_copy();
      msg.clear_hashes();
      off += n;
    }
    return true;
  };
  bool ok = send(0, header->data_offset);
  for (size_t i = 0; ok && i < chunks.size(); ++i)
    ok = send(chunks[i].at, chunks[i].bytes);
  ok = ok &&
       send(header->footer_offset, copy.image_bytes() - header->footer_offset);
  if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader left");
  return grpc::Status::OK;
}

}  // namespace

class ReplicaServer::Service final : public rv1::Replica::Service {
 public:
  Service(ReplicaServerOptions options, ReplicaStore* store,
          StagedShards* staged)
      : options_(std::move(options)), store_(store), staged_(staged) {}

  grpc::Status Put(grpc::ServerContext* ctx,
                   grpc::ServerReader<rv1::PutChunk>* reader,
                   rv1::PutResponse* resp) override {
    rv1::PutChunk chunk;
    if (!reader->Read(&chunk))
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "copy: the stream ended before the first chunk");
    if (!chunk.has_copy())
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "copy: the first chunk must describe the copy");
    if (grpc::Status s = CheckSource(*ctx, chunk.copy()); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<ReplicaStore::Incoming>> in =
        store_->Begin(chunk.copy());
    if (!in.ok()) return ToGrpc(in.status());
    uint64_t got = 0;
    const uint64_t want = (*in)->size();
    do {
      if (chunk.has_copy() && got != 0)
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "copy: only the first chunk describes the copy");
      if (chunk.offset() != got)
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("offset: ", chunk.offset(), ", expected ", got,
                         " (chunks come in order)"));
      if (chunk.data().size() > kMaxReplicaChunkBytes)
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("data: ", chunk.data().size(),
                                         " bytes in one chunk; at most ",
                                         kMaxReplicaChunkBytes));
      if (chunk.data().size() > want - got)
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("data: ends at ", got + chunk.data().size(),
                         ", past image_bytes ", want));
      std::memcpy((*in)->data() + got, chunk.data().data(),
                  chunk.data().size());
      got += chunk.data().size();
    } while (reader->Read(&chunk));
    if (got != want)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("data: ", got, " bytes arrived of ",
                                       want, " (copy.image_bytes)"));
    absl::StatusOr<uint64_t> digest = Keep(**in);
    if (!digest.ok()) return ToGrpc(digest.status());
    resp->set_checksum_digest(*digest);
    return grpc::Status::OK;
  }

  grpc::Status OfferPut(grpc::ServerContext* ctx, const rv1::ShardCopy* copy,
                        rv1::BulkOffer* offer) override {
    if (grpc::Status s = CheckSource(*ctx, *copy); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<ReplicaStore::Incoming>> in =
        store_->Begin(*copy);
    if (!in.ok()) return ToGrpc(in.status());
    std::shared_ptr<ReplicaStore::Incoming> incoming = std::move(*in);
    BulkTransfer t;
    t.kind = BulkKind::kPut;
    t.bytes = incoming->size();
    t.dst = incoming->data();
    t.what = Name(*copy);
    t.finish = [this, incoming] { return Keep(*incoming); };
    t.pin = std::move(incoming);
    return Issue(std::move(t), offer);
  }

  grpc::Status OfferGet(grpc::ServerContext*, const rv1::GetRequest* req,
                        rv1::BulkOffer* offer) override {
    if (absl::Status s = ValidateJobName(req->job(), "job"); !s.ok())
      return ToGrpc(s);
    BulkTransfer t;
    t.kind = BulkKind::kGet;
    if (req->replica()) {
      std::shared_ptr<const HeldReplica> held =
          store_->Find(req->job(), req->step(), req->rank());
      if (!held) return NotFound(*req);
      *offer->mutable_copy() = held->copy;
      t.src = held->data();
      t.pin = std::const_pointer_cast<HeldReplica>(std::move(held));
    } else {
      if (staged_ == nullptr) return NotFound(*req);
      absl::StatusOr<StagedCopy> snap =
          staged_->SnapshotStaged(req->job(), req->step(), req->rank());
      if (!snap.ok())
        return snap.status().code() == absl::StatusCode::kNotFound
                   ? NotFound(*req)
                   : ToGrpc(snap.status());
      *offer->mutable_copy() = snap->copy;
      auto pinned = std::make_shared<StagedCopy>(std::move(*snap));
      t.src = pinned->data();
      t.finish = [this, pinned, job = req->job(),
                  rank = req->rank()]() -> absl::StatusOr<uint64_t> {
        // The reader verifies what it got; this says why it would not.
        if (!staged_->StagedUnchanged(job, rank, *pinned))
          return absl::AbortedError(
              "step: the slot was overwritten by a save while it was sent; "
              "fetch again");
        return uint64_t{0};
      };
      t.pin = std::move(pinned);
    }
    t.bytes = offer->copy().image_bytes();
    t.what = Name(offer->copy());
    return Issue(std::move(t), offer);
  }

  grpc::Status GetRanges(grpc::ServerContext*, const rv1::RangeRequest* req,
                         grpc::ServerWriter<rv1::RangeChunk>* writer) override {
    if (absl::Status s = ValidateJobName(req->job(), "job"); !s.ok())
      return ToGrpc(s);
    rv1::GetRequest get;
    get.set_job(req->job());
    get.set_step(req->step());
    get.set_rank(req->rank());
    get.set_replica(req->replica());
    if (req->replica()) {
      std::shared_ptr<const HeldReplica> held =
          store_->Find(req->job(), req->step(), req->rank());
      if (!held) return NotFound(get);
      return StreamRanges(writer, *req, held->copy, held->data(), nullptr);
    }
    if (staged_ == nullptr) return NotFound(get);
    absl::StatusOr<StagedCopy> snap =
        staged_->SnapshotStaged(req->job(), req->step(), req->rank());
    if (!snap.ok())
      return snap.status().code() == absl::StatusCode::kNotFound
                 ? NotFound(get)
                 : ToGrpc(snap.status());
    grpc::Status st = StreamRanges(writer, *req, snap->copy, snap->data(),
                                   &snap->chunk_hashes);
    if (st.ok() && !staged_->StagedUnchanged(req->job(), req->rank(), *snap))
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "step: the slot was overwritten by a save while "
                          "it was sent; fetch again");
    return st;
  }

  void set_bulk(BulkTokens* tokens, int port) {
    tokens_ = tokens;
    bulk_port_ = port;
  }

  grpc::Status Get(grpc::ServerContext*, const rv1::GetRequest* req,
                   grpc::ServerWriter<rv1::GetChunk>* writer) override {
    if (absl::Status s = ValidateJobName(req->job(), "job"); !s.ok())
      return ToGrpc(s);
    auto not_found = [&] { return NotFound(*req); };
    if (req->replica()) {
      std::shared_ptr<const HeldReplica> held =
          store_->Find(req->job(), req->step(), req->rank());
      if (!held) return not_found();
      // The shared_ptr keeps the mapping while it streams, even if a newer
      // copy replaces this one meanwhile.
      if (!StreamImage(writer, held->copy, held->data()))
        return grpc::Status(grpc::StatusCode::CANCELLED, "the reader left");
      return grpc::Status::OK;
    }
    if (staged_ == nullptr) return not_found();
    absl::StatusOr<StagedCopy> snap =
        staged_->SnapshotStaged(req->job(), req->step(), req->rank());
    if (!snap.ok()) {
      if (snap.status().code() == absl::StatusCode::kNotFound)
        return not_found();
      return ToGrpc(snap.status());
    }
    if (!StreamImage(writer, snap->copy, snap->data()))
      return grpc::Status(grpc::StatusCode::CANCELLED, "the reader left");
    // The reader verifies what it got; this says why it would not verify.
    if (!staged_->StagedUnchanged(req->job(), req->rank(), *snap))
      return grpc::Status(grpc::StatusCode::ABORTED,
                          "step: the slot was overwritten by a save while "
                          "it was sent; fetch again");
    return grpc::Status::OK;
  }

 private:
  static std::string Name(const rv1::ShardCopy& c) {
    return absl::StrCat("replica of job '", c.job(), "' step ", c.step(),
                        " rank ", c.rank());
  }

  static grpc::Status NotFound(const rv1::GetRequest& req) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("step: no ", req.replica() ? "replica" : "staged shard",
                     " of job '", req.job(), "' step ", req.step(), " rank ",
                     req.rank(), " here"));
  }

  // Under TLS a copy's source_node must be one of the caller's
  // certificate identities: no node plants a copy in another's name.
  static grpc::Status CheckSource(const grpc::ServerContext& ctx,
                                  const rv1::ShardCopy& copy) {
    const std::vector<std::string> ids = Identities(ctx);
    if (!ids.empty() &&
        std::find(ids.begin(), ids.end(), copy.source_node()) == ids.end())
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("copy.source_node: '", copy.source_node(),
                       "' is not the caller's certificate identity"));
    return grpc::Status::OK;
  }

  // Verifies an arrived copy and keeps it (Put and the bulk put): its
  // digest, or the refusal.
  absl::StatusOr<uint64_t> Keep(ReplicaStore::Incoming& in) {
    absl::StatusOr<std::shared_ptr<const HeldReplica>> held = in.Commit();
    if (!held.ok()) {
      LogWarning(absl::StrCat("replica refused: ", held.status().message()));
      return held.status();
    }
    LogInfo(absl::StrCat("replica of job '", (*held)->copy.job(), "' step ",
                         (*held)->copy.step(), " rank ", (*held)->copy.rank(),
                         " from ", (*held)->copy.source_node(), " verified (",
                         (*held)->copy.image_bytes(), " bytes)"));
    if (options_.on_replicated) options_.on_replicated(**held);
    return (*held)->digest;
  }

  grpc::Status Issue(BulkTransfer t, rv1::BulkOffer* offer) {
    absl::StatusOr<std::string> token = tokens_->Issue(std::move(t));
    if (!token.ok()) return ToGrpc(token.status());
    offer->set_token(*token);
    offer->set_port(static_cast<uint32_t>(bulk_port_));
    offer->set_expires_in_ms(static_cast<uint64_t>(tokens_->ttl().count()));
    return grpc::Status::OK;
  }

  const ReplicaServerOptions options_;
  ReplicaStore* const store_;
  StagedShards* const staged_;
  BulkTokens* tokens_ = nullptr;
  int bulk_port_ = 0;
};

absl::StatusOr<std::unique_ptr<ReplicaServer>> ReplicaServer::Start(
    ReplicaServerOptions options, ReplicaStore* store, StagedShards* staged) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                        coordinator::LoadServerCredentials(options.tls));
  auto server = std::unique_ptr<ReplicaServer>(new ReplicaServer);
  const std::string listen = absl::StrCat(options.host, ":", options.port);
  server->tokens_ = std::make_unique<BulkTokens>(options.bulk_token_ttl);
  BulkListenerOptions bo;
  bo.host = options.host;
  bo.port = options.bulk_port;
  bo.stall_timeout = options.bulk_stall_timeout;
  CKPT_ASSIGN_OR_RETURN(server->bulk_,
                        BulkListener::Listen(bo, server->tokens_.get()));
  server->service_ =
      std::make_unique<Service>(std::move(options), store, staged);
  server->service_->set_bulk(server->tokens_.get(), server->bulk_->port());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, creds, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(kMaxReplicaChunkBytes + (64 << 10)));
  builder.SetMaxSendMessageSize(
      static_cast<int>(kMaxReplicaChunkBytes + (64 << 10)));
  // Bulk bytes: large frames and a window of several chunks, not HTTP/2's
  // 16 KiB frames and 64 KiB start.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             kHttp2WindowBytes);
  server->server_ = builder.BuildAndStart();
  if (!server->server_ || server->port_ == 0)
    return absl::UnavailableError(
        absl::StrCat("--replica-port: cannot listen on ", listen));
  return server;
}

ReplicaServer::~ReplicaServer() { Shutdown(); }

void ReplicaServer::Shutdown() {
  if (server_)
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
  if (bulk_) bulk_->Shutdown();
  if (tokens_) tokens_->Sweep();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> ReplicaChannel(
    const coordinator::TlsFiles& tls, const std::string& node_id,
    const std::string& host, uint32_t port) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds,
                        coordinator::LoadClientCredentials(tls, "--tls"));
  grpc::ChannelArguments args;
  if (tls.enabled() && !node_id.empty()) args.SetSslTargetNameOverride(node_id);
  args.SetMaxReceiveMessageSize(
      static_cast<int>(kMaxReplicaChunkBytes + (64 << 10)));
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  // Each peer gets a channel of its own (not a shared subchannel).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  const std::string target =
      host.find(':') != std::string::npos && host.front() != '['
          ? absl::StrCat("[", host, "]:", port)
          : absl::StrCat(host, ":", port);
  return grpc::CreateCustomChannel(target, creds, args);
}

}  // namespace ckpt::daemon
