// The replica transport's bulk path (daemon/replica/replica_bulk*.h,
// doc/replicas.md "Transport") over a real replica listener and a real
// bulk listener on loopback: a put and a get move the bytes bit-exact
// through the offer's one-time token; a wrong, replayed or expired token
// and every malformed header field are refused naming the field, and
// change nothing; a byte damaged in transit is refused and not counted; a
// replacement that holds a lost rank's copy itself takes it from its own
// memory; the grpc transport stays available.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "daemon/agent/peer_fetch.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_bulk_wire.h"
#include "storage/manifest.h"
#include "tests/replica_fixture.h"
#include "tests/test_util.h"
#include "util/thread_priority.h"

namespace ckpt::testing {
namespace {

using ReplicaBulkTest = ReplicaFixture;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A shard of several bulk I/O calls (kBulkIoBytes) with a partial last one.
storage::Shard BigImage(const std::string& job, uint64_t step) {
  return ReplicaImage(job, step, 0, 1, (5 * daemon::kBulkIoBytes) / 4 + 12345);
}

class BulkFixture : public ReplicaBulkTest {
 protected:
  daemon::PutOptions Opts(bool corrupt = false) {
    daemon::PutOptions po;
    po.deadline = std::chrono::system_clock::now() + seconds(30);
    po.corrupt = corrupt;
    return po;
  }
  absl::StatusOr<uint64_t> BulkPut(const rv1::ShardCopy& copy,
                                   const std::vector<char>& image,
                                   bool corrupt = false) {
    return daemon::SendReplica(daemon::ReplicaTransport::kBulk, *Channel(),
                               "127.0.0.1", copy, image.data(), Opts(corrupt));
  }
  rv1::BulkOffer OfferPut(const rv1::ShardCopy& copy) {
    auto stub = rv1::Replica::NewStub(Channel());
    grpc::ClientContext ctx;
    rv1::BulkOffer offer;
    grpc::Status s = stub->OfferPut(&ctx, copy, &offer);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return offer;
  }
  // Presents `h` on a fresh bulk connection; the holder's first reply,
  // and (when it accepted) `payload` sent and the final reply.
  absl::Status Present(const daemon::BulkHeader& h,
                       const std::vector<char>* payload = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + seconds(20);
    auto fd = daemon::ConnectBulk("127.0.0.1", server_->bulk_port(), deadline);
    if (!fd.ok()) return fd.status();
    const auto raw = daemon::EncodeBulkHeader(h);
    absl::Status s =
        daemon::SendAll(*fd, raw.data(), raw.size(), deadline, "header");
    if (s.ok()) s = daemon::ReadBulkReply(*fd, deadline, "accept", nullptr);
    if (s.ok() && payload != nullptr) {
      s = daemon::SendAll(*fd, payload->data(), payload->size(), deadline,
                          "payload");
      if (s.ok()) s = daemon::ReadBulkReply(*fd, deadline, "done", nullptr);
    }
    close(*fd);
    return s;
  }
  daemon::BulkHeader HeaderFor(const rv1::BulkOffer& offer, uint64_t bytes) {
    daemon::BulkHeader h;
    h.kind = daemon::BulkKind::kPut;
    h.token = offer.token();
    h.length = bytes;
    return h;
  }
  void ExpectNothingHeld() {
    const daemon::ReplicaStats st = store_->Stats();
    EXPECT_EQ(st.held, 0u);
    EXPECT_EQ(st.verified, 0u);
    EXPECT_EQ(replicated_.load(), 0);
  }
};

TEST_F(BulkFixture, PutAndGetMoveTheBytesBitExact) {
  StartHolder(1ull << 30);
  const storage::Shard s = BigImage("j", 5);
  ASSERT_GT(s.image.size(), 4 * daemon::kBulkIoBytes);
  auto digest = BulkPut(CopyOf(s), s.image);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, storage::ChecksumsDigest(s.info));
  EXPECT_EQ(replicated_.load(), 1);
  // Received and verified in the background (util/thread_priority.h).
  EXPECT_EQ(replicated_nice_.load(), kBackgroundNice);
  auto held = store_->Find("j", 5, 0);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(std::memcmp(held->data(), s.image.data(), s.image.size()), 0);
  auto back = Get("j", 5, 0, true, daemon::ReplicaTransport::kBulk);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->size(), s.image.size());
  EXPECT_TRUE(*back == s.image);
  EXPECT_EQ(server_->bulk_stats().served, 2u);
  EXPECT_EQ(server_->bulk_stats().refused, 0u);
}

TEST_F(BulkFixture, AWrongTokenIsRefusedAndChangesNothing) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 5, 0, 1);
  const rv1::BulkOffer offer = OfferPut(CopyOf(s));
  daemon::BulkHeader h = HeaderFor(offer, s.image.size());
  h.token[3] ^= 1;
  absl::Status refused = Present(h, &s.image);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("token: unknown"), std::string::npos)
      << refused;
  ExpectNothingHeld();
  // The offer's own token was not spent by the stranger: it still works.
  EXPECT_TRUE(Present(HeaderFor(offer, s.image.size()), &s.image).ok());
  EXPECT_EQ(store_->Stats().held, 1u);
  EXPECT_EQ(replicated_.load(), 1);
}

TEST_F(BulkFixture, AReplayedTokenIsRefusedAndChangesNothing) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 5, 0, 1);
  const rv1::BulkOffer offer = OfferPut(CopyOf(s));
  ASSERT_TRUE(Present(HeaderFor(offer, s.image.size()), &s.image).ok());
  const daemon::ReplicaStats before = store_->Stats();
  // The same token again, with other bytes: refused before any is read.
  std::vector<char> other = s.image;
  other[other.size() / 2] ^= 0x11;
  absl::Status replay = Present(HeaderFor(offer, s.image.size()), &other);
  EXPECT_EQ(replay.code(), absl::StatusCode::kInvalidArgument) << replay;
  EXPECT_NE(replay.message().find("token: already used"), std::string::npos)
      << replay;
  const daemon::ReplicaStats after = store_->Stats();
  EXPECT_EQ(after.verified, before.verified);
  EXPECT_EQ(after.rejected, before.rejected);
  EXPECT_EQ(after.used_bytes, before.used_bytes);
  auto held = store_->Find("j", 5, 0);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(std::memcmp(held->data(), s.image.data(), s.image.size()), 0);
}

TEST_F(BulkFixture, AnExpiredTokenIsRefusedAndItsReservationGivenBack) {
  StartHolder(1ull << 30, {}, nullptr, milliseconds(200));
  const storage::Shard s = ReplicaImage("j", 5, 0, 1);
  const rv1::BulkOffer offer = OfferPut(CopyOf(s));
  EXPECT_EQ(store_->Stats().used_bytes, s.image.size());  // reserved
  // The listener forgets it within a second of its expiry.
  ASSERT_TRUE(Eventually([&] { return store_->Stats().used_bytes == 0; }));
  absl::Status late = Present(HeaderFor(offer, s.image.size()), &s.image);
  EXPECT_EQ(late.code(), absl::StatusCode::kInvalidArgument) << late;
  EXPECT_NE(late.message().find("token: expired"), std::string::npos) << late;
  ExpectNothingHeld();
}

TEST_F(BulkFixture, EveryHeaderFieldIsCheckedAndNamed) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 5, 0, 1);
  struct Case {
    const char* field;
    std::function<void(daemon::BulkHeader&, std::array<char, 64>&)> spoil;
  };
  const std::vector<Case> cases = {
      {"magic: ", [](auto&, auto& raw) { raw[0] = 'X'; }},
      {"kind: 7", [](auto&, auto& raw) { raw[8] = 7; }},
      {"reserved: ", [](auto&, auto& raw) { raw[60] = 1; }},
      {"kind: the token was issued for a put, not a get",
       [](auto& h, auto&) { h.kind = daemon::BulkKind::kGet; }},
      {"offset: 4096", [](auto& h, auto&) { h.offset = 4096; }},
      {"length: ", [](auto& h, auto&) { h.length += 4096; }},
  };
  for (const Case& c : cases) {
    const rv1::BulkOffer offer = OfferPut(CopyOf(s));
    daemon::BulkHeader h = HeaderFor(offer, s.image.size());
    std::array<char, 64> raw{};
    c.spoil(h, raw);  // header-level changes first
    auto encoded = daemon::EncodeBulkHeader(h);
    for (size_t i = 0; i < raw.size(); ++i)
      if (raw[i] != 0) encoded[i] = raw[i];  // then raw byte damage
    const auto deadline = std::chrono::steady_clock::now() + seconds(20);
    auto fd = daemon::ConnectBulk("127.0.0.1", server_->bulk_port(), deadline);
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_TRUE(
        daemon::SendAll(*fd, encoded.data(), encoded.size(), deadline, "h")
            .ok());
    absl::Status r = daemon::ReadBulkReply(*fd, deadline, "reply", nullptr);
    close(*fd);
    EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(r.message().find(c.field), std::string::npos)
        << c.field << ": " << r;
  }
  ExpectNothingHeld();
  EXPECT_EQ(server_->bulk_stats().served, 0u);
  EXPECT_EQ(server_->bulk_stats().refused, cases.size());
}

TEST_F(BulkFixture, AByteDamagedInTransitIsRefusedAndNotCounted) {
  StartHolder(1ull << 30);
  const storage::Shard s = BigImage("j", 5);
  // PutOptions::corrupt is CKPTD_TEST_FAULT=corrupt-replica-sends: a byte
  // of every bulk I/O call flipped on the wire, never in the image.
  auto put = BulkPut(CopyOf(s), s.image, /*corrupt=*/true);
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss) << put.status();
  EXPECT_NE(put.status().message().find("checksum mismatch"), std::string::npos)
      << put.status();
  ExpectNothingHeld();
  EXPECT_EQ(store_->Stats().rejected, 1u);
  EXPECT_EQ(store_->Stats().used_bytes, 0u);  // its memory given back
  // The same bytes undamaged go through.
  EXPECT_TRUE(BulkPut(CopyOf(s), s.image).ok());
}

TEST_F(BulkFixture, AReplacementHoldingTheCopyTakesItFromItsOwnMemory) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 7, 1, 2);
  ASSERT_TRUE(BulkPut(CopyOf(s), s.image).ok());
  Node& c = OpenNode("c", dir_.path() + "/shared");
  // The plan names this node ("b", the holder) as the source, at a port
  // where nothing listens: any network fetch would fail.
  coord::v1::ShardSource src;
  src.set_node_id("b");
  src.set_host("127.0.0.1");
  src.set_port(FreeLoopbackPort());
  src.set_replica(true);
  daemon::PeerFetchOptions peer;
  peer.node_id = "b";
  peer.held = [this](const std::string& job, uint64_t step, uint32_t rank) {
    return store_->Find(job, step, rank);
  };
  std::vector<daemon::FallbackReport> fallbacks;
  const uint64_t served = server_->bulk_stats().served;
  absl::Status st = daemon::PrefetchRank(
      *c.engine, peer, "j", 2, 7, 1, "", &src, getuid(),
      [&](daemon::FallbackReport f) { fallbacks.push_back(f); });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(fallbacks.empty());
  EXPECT_EQ(server_->bulk_stats().served, served);  // nothing went over TCP
  auto restored = Restore(c, "j", 7, 1);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == s.image);
}

TEST_F(BulkFixture, TheGrpcTransportStaysAvailable) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 7, 1, 2);
  ASSERT_TRUE(daemon::SendReplica(daemon::ReplicaTransport::kGrpc, *Channel(),
                                  "127.0.0.1", CopyOf(s), s.image.data(),
                                  Opts())
                  .ok());
  Node& c = OpenNode("c", dir_.path() + "/shared");
  coord::v1::ShardSource src;
  src.set_node_id("b");
  src.set_host("127.0.0.1");
  src.set_port(server_->port());
  src.set_replica(true);
  daemon::PeerFetchOptions peer;
  peer.transport = daemon::ReplicaTransport::kGrpc;
  ASSERT_TRUE(daemon::PrefetchRank(*c.engine, peer, "j", 2, 7, 1, "", &src,
                                   getuid(), {})
                  .ok());
  EXPECT_EQ(server_->bulk_stats().served, 0u);  // all over the gRPC streams
  auto restored = Restore(c, "j", 7, 1);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == s.image);
  EXPECT_EQ(daemon::ParseReplicaTransport("udp", "--replica-transport")
                .status()
                .message(),
            "--replica-transport: 'udp' is neither bulk nor grpc");
}

// A holder running a ckptd from before the bulk path: the Put and Get
// streams only (gRPC answers UNIMPLEMENTED to OfferPut and OfferGet), each
// call passed on to the fixture's holder.
class OlderHolder final : public rv1::Replica::Service {
 public:
  explicit OlderHolder(std::shared_ptr<grpc::Channel> holder)
      : stub_(rv1::Replica::NewStub(std::move(holder))) {}
  grpc::Status Put(grpc::ServerContext*, grpc::ServerReader<rv1::PutChunk>* in,
                   rv1::PutResponse* resp) override {
    grpc::ClientContext ctx;
    auto out = stub_->Put(&ctx, resp);
    rv1::PutChunk chunk;
    while (in->Read(&chunk) && out->Write(chunk)) {
    }
    out->WritesDone();
    return out->Finish();
  }
  grpc::Status Get(grpc::ServerContext*, const rv1::GetRequest* req,
                   grpc::ServerWriter<rv1::GetChunk>* out) override {
    grpc::ClientContext ctx;
    auto in = stub_->Get(&ctx, *req);
    rv1::GetChunk chunk;
    while (in->Read(&chunk) && out->Write(chunk)) {
    }
    return in->Finish();
  }

 private:
  std::unique_ptr<rv1::Replica::Stub> stub_;
};

TEST_F(BulkFixture, AHolderFromBeforeTheBulkPathGetsTheGrpcStreams) {
  StartHolder(1ull << 30);
  OlderHolder older(Channel());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&older);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  auto channel = daemon::ReplicaChannel({}, "b", "127.0.0.1", port);
  ASSERT_TRUE(channel.ok()) << channel.status();
  const storage::Shard s = BigImage("j", 8);
  auto digest =
      daemon::SendReplica(daemon::ReplicaTransport::kBulk, **channel,
                          "127.0.0.1", CopyOf(s), s.image.data(), Opts());
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, storage::ChecksumsDigest(s.info));
  auto got =
      Get("j", 8, 0, true, daemon::ReplicaTransport::kBulk, channel->get());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == s.image);
  // Nothing went over the bulk listener.
  EXPECT_EQ(server_->bulk_stats().served, 0u);
  server->Shutdown();
}

TEST(BulkWireTest, ASendToAPeerThatStoppedReadingEndsCancelledWhenAsked) {
  // The peer never reads: without the cancel the send would last its
  // deadline (two minutes).
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  daemon::PrepareBulkSocket(fds[0]);
  std::vector<char> bytes(64 << 20);
  std::atomic<bool> cancel{false};
  std::thread canceller([&] {
    // Once the send has begun (its first bytes wait at the peer, which
    // cannot take 64 MiB), it is cancelled.
    pollfd p{fds[1], POLLIN, 0};
    (void)poll(&p, 1, -1);
    cancel = true;
  });
  const absl::Status s = daemon::SendAll(
      fds[0], bytes.data(), bytes.size(),
      std::chrono::steady_clock::now() + std::chrono::minutes(2), "test send",
      daemon::kNoStallLimit, &cancel);
  canceller.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(s.message(), "test send: cancelled");
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace ckpt::testing
