// The holder's side of peer replicas (doc/replicas.md) over a real replica
// listener on loopback: a copy is kept only once it verifies, a damaged
// one is refused and never reported, the budget keeps the two newest copies
// per rank and refuses past them, bad input is refused naming the field while
// the listener goes on serving, and under mutual TLS only certificates of
// the cluster's CA get in.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "storage/manifest.h"
#include "tests/replica_fixture.h"
#include "tests/smaps.h"

namespace ckpt::testing {
namespace {

using ReplicaHolderTest = ReplicaFixture;

TEST_F(ReplicaHolderTest, VerifiedCopyIsKeptReportedAndServedBack) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 5, 0, 2);
  auto digest = Put(CopyOf(s), s.image);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, storage::ChecksumsDigest(s.info));
  EXPECT_EQ(replicated_.load(), 1);
  auto back = Get("j", 5, 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == s.image);
}

TEST_F(ReplicaHolderTest, DamagedCopyIsRefusedNeverHeldNorReported) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 5, 0, 2);
  std::vector<char> bad = s.image;
  bad[s.info.tensors[0].offset + 1000] ^= 0x40;  // a flip in transit
  auto put = Put(CopyOf(s), bad);
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(put.status().message().find("layer0.weight"), std::string::npos)
      << put.status();
  // A copy whose checksums are not the shard's is as bad.
  rv1::ShardCopy lying = CopyOf(s);
  lying.set_checksums(0, lying.checksums(0) + 1);
  EXPECT_EQ(Put(lying, s.image).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(replicated_.load(), 0);
  EXPECT_EQ(Get("j", 5, 0).status().code(), absl::StatusCode::kNotFound);
  const daemon::ReplicaStats st = store_->Stats();
  EXPECT_EQ(st.rejected, 2u);
  EXPECT_EQ(st.held, 0u);
  EXPECT_EQ(st.used_bytes, 0u);  // the refused copies' memory is given back
}

// The two newest copies per rank are kept, so the step before survives one
// rank's newer copy arriving first; previous copies give way to a copy that
// does not fit, and past that the budget refuses.
TEST_F(ReplicaHolderTest,
       BudgetKeepsTheTwoNewestCopiesPerRankAndRefusesPastIt) {
  const storage::Shard r0s1 = ReplicaImage("j", 1, 0, 4);
  const uint64_t x = r0s1.image.size();
  StartHolder(3 * x + x / 2);  // three copies held, or two and one arriving
  ASSERT_TRUE(Put(CopyOf(r0s1), r0s1.image).ok());
  const storage::Shard r1s1 = ReplicaImage("j", 1, 1, 4, 100000, 5);
  ASSERT_TRUE(Put(CopyOf(r1s1), r1s1.image).ok());
  // Rank 0's step 2 arrives; rank 1's does not (its node dies): step 1 is
  // still held for both ranks.
  const storage::Shard r0s2 = ReplicaImage("j", 2, 0, 4, 100000, 2);
  ASSERT_TRUE(Put(CopyOf(r0s2), r0s2.image).ok());
  EXPECT_TRUE(Get("j", 2, 0).ok());
  auto step1 = Get("j", 1, 0);
  ASSERT_TRUE(step1.ok()) << step1.status();
  EXPECT_TRUE(*step1 == r0s1.image);
  EXPECT_TRUE(Get("j", 1, 1).ok());
  EXPECT_EQ(store_->Stats().held, 3u);
  // Rank 1's step 2 does not fit: the previous copy of a rank makes room
  // (rank 1 has none: rank 0's step 1 goes).
  const storage::Shard r1s2 = ReplicaImage("j", 2, 1, 4, 100000, 6);
  ASSERT_TRUE(Put(CopyOf(r1s2), r1s2.image).ok());
  EXPECT_EQ(Get("j", 1, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Get("j", 1, 1).ok());
  EXPECT_TRUE(Get("j", 2, 0).ok());
  EXPECT_TRUE(Get("j", 2, 1).ok());
  EXPECT_EQ(store_->Stats().used_bytes, 3 * x);  // the dropped one unmapped
  // An older save of a rank never replaces its newer copy.
  auto older = Put(CopyOf(r0s1), r0s1.image);
  EXPECT_EQ(older.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(older.status().message().find("copy.step"), std::string::npos);
  // A rollback: a smaller step of a newer generation is the newest copy.
  const storage::Shard r0s0 = ReplicaImage("j", 0, 0, 4, 100000, 3);
  ASSERT_TRUE(Put(CopyOf(r0s0, /*generation=*/2), r0s0.image).ok());
  EXPECT_TRUE(Get("j", 0, 0).ok());
  EXPECT_EQ(Get("j", 1, 1).status().code(), absl::StatusCode::kNotFound)
      << "rank 1's previous copy made room";
  // With no previous copy left to give way, the budget refuses by name.
  const storage::Shard r2 = ReplicaImage("j", 1, 2, 4);
  ASSERT_TRUE(Put(CopyOf(r2), r2.image).ok());  // rank 0's step 2 goes
  const storage::Shard r3 = ReplicaImage("j", 1, 3, 4);
  auto over = Put(CopyOf(r3), r3.image);
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("replica_memory_bytes"),
            std::string::npos)
      << over.status();
  EXPECT_EQ(store_->Stats().held, 3u);
  EXPECT_LE(store_->Stats().used_bytes, 3 * x + x / 2);
  EXPECT_TRUE(Get("j", 0, 0).ok());
  EXPECT_TRUE(Get("j", 2, 1).ok());
  EXPECT_TRUE(Get("j", 1, 2).ok());
}

// Begins, fills and commits a copy of `s` in `store`: its status.
absl::Status Keep(daemon::ReplicaStore& store, const storage::Shard& s,
                  const rv1::ShardCopy& copy) {
  auto in = store.Begin(copy);
  if (!in.ok()) return in.status();
  std::memcpy((*in)->data(), s.image.data(), s.image.size());
  return (*in)->Commit().status();
}

// A previous copy given up to make room for another rank's copy is handed
// to the eviction hook, as a replaced one is: the holder retracts it.
TEST(ReplicaStoreEvictionTest, ACopyDroppedForRoomGoesThroughTheEvictHook) {
  const uint64_t x = ReplicaImage("j", 5, 0, 3).image.size();
  std::vector<rv1::ShardCopy> evicted;
  daemon::ReplicaStore store(
      4 * x + x / 2, [&](const rv1::ShardCopy& c) { evicted.push_back(c); });
  auto keep = [&](uint64_t step, uint32_t rank) {
    const storage::Shard s = ReplicaImage(
        "j", step, rank, 3, 100000, static_cast<uint32_t>(step * 10 + rank));
    return Keep(store, s, CopyOf(s));
  };
  for (uint32_t rank = 0; rank < 3; ++rank) ASSERT_TRUE(keep(5, rank).ok());
  ASSERT_TRUE(keep(6, 2).ok());  // rank 2 holds steps 6 and 5
  EXPECT_TRUE(evicted.empty());
  // Rank 1's step 6 does not fit: rank 2's previous copy goes.
  ASSERT_TRUE(keep(6, 1).ok());
  EXPECT_EQ(store.Find("j", 5, 2), nullptr);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0].step(), 5u);
  EXPECT_EQ(evicted[0].rank(), 2u);
  EXPECT_EQ(evicted[0].source_node(), "a");
}

// A copy of a rank sent by another node, whatever generation and step it
// claims, never keeps out the copies of the node the rank is on: a copy
// from another source than the held one replaces it. From one source an
// older save still never replaces a newer one, and the same save again is
// no new copy.
TEST(ReplicaStoreOrderTest, AnotherNodesHighClaimDoesNotBlockTheRanksCopies) {
  std::vector<rv1::ShardCopy> evicted;
  daemon::ReplicaStore store(
      1ull << 30, [&](const rv1::ShardCopy& c) { evicted.push_back(c); });
  const storage::Shard claim = ReplicaImage("j", 100, 0, 1, 1000, 1);
  ASSERT_TRUE(Keep(store, claim, CopyOf(claim, 9, "p")).ok());
  const storage::Shard mine = ReplicaImage("j", 3, 0, 1, 1000, 2);
  absl::Status kept = Keep(store, mine, CopyOf(mine, 0, "a"));
  ASSERT_TRUE(kept.ok()) << kept;
  ASSERT_NE(store.Find("j", 3, 0), nullptr);
  EXPECT_EQ(store.Find("j", 3, 0)->copy.source_node(), "a");
  const daemon::ReplicaStats before = store.Stats();
  auto again = store.Begin(CopyOf(mine, 0, "a"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists)
      << again.status();
  const storage::Shard older = ReplicaImage("j", 2, 0, 1, 1000, 3);
  absl::Status refused = Keep(store, older, CopyOf(older, 0, "a"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("copy.step"), std::string::npos);
  EXPECT_EQ(store.Stats().held, before.held);
  EXPECT_EQ(store.Stats().used_bytes, before.used_bytes);
  EXPECT_EQ(store.Find("j", 2, 0), nullptr);
}

// An evicted copy's mapping takes the next copy of its size: the copy is
// written into pages that are already there (no page faults, no zeroing),
// and the spare counts against the budget, giving way to a copy that needs
// the room.
// Whether anonymous memory that asks for transparent huge pages gets them
// (THP "always" or "madvise").
bool AnonHugePagesOn() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  return line.find("[always]") != std::string::npos ||
         line.find("[madvise]") != std::string::npos;
}

// A copy arrives into fresh memory as 2 MiB pages: 2 MiB-aligned, and its
// whole 2 MiB pieces huge (the old shared mapping: none, and 1,027 page
// faults for this copy).
TEST(ReplicaStoreMemoryTest, AFreshCopyArrivesInHugePages) {
  if (!AnonHugePagesOn())
    GTEST_SKIP() << "transparent huge pages are off on this kernel";
  const storage::Shard s = ReplicaImage("j", 1, 0, 2, 1 << 20);  // 4 MiB
  daemon::ReplicaStore store(2 * s.image.size());
  auto in = store.Begin(CopyOf(s));
  ASSERT_TRUE(in.ok()) << in.status();
  std::memcpy((*in)->data(), s.image.data(), s.image.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*in)->data()) % (2 << 20), 0u);
  EXPECT_GE(testing::SmapsKb((*in)->data(), "AnonHugePages"),
            static_cast<long>(s.image.size() / (2 << 20) * 2048));
  ASSERT_TRUE((*in)->Commit().ok());
}

TEST(ReplicaStoreMemoryTest, AnEvictedCopysMappingTakesTheNextCopyUnfaulted) {
  constexpr uint64_t kFloats = 1 << 20;  // 4 MiB: 1,024 pages
  const uint64_t x = ReplicaImage("j", 1, 0, 2, kFloats).image.size();
  daemon::ReplicaStore store(3 * x + x / 2);
  struct Arrival {
    const char* base = nullptr;
    long faults = -1;
  };
  auto arrive = [&](uint32_t rank, uint64_t step, uint64_t floats) {
    const storage::Shard s = ReplicaImage("j", step, rank, 2, floats);
    auto in = store.Begin(CopyOf(s));
    EXPECT_TRUE(in.ok()) << in.status();
    if (!in.ok()) return Arrival{};
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    std::memcpy((*in)->data(), s.image.data(), s.image.size());
    getrusage(RUSAGE_THREAD, &after);
    Arrival a{(*in)->data(), after.ru_minflt - before.ru_minflt};
    auto held = (*in)->Commit();
    EXPECT_TRUE(held.ok()) << held.status();
    return a;
  };
  const Arrival s1 = arrive(0, 1, kFloats);
  const Arrival s2 = arrive(0, 2, kFloats);
  arrive(0, 3, kFloats);     // step 1 goes: a spare
  if (!AnonHugePagesOn()) {  // else fresh pages fault once per 2 MiB
    EXPECT_GE(s1.faults, 256) << "fresh pages fault (the measure works)";
  }
  EXPECT_EQ(store.Stats().spare_bytes, x);
  EXPECT_EQ(store.Stats().used_bytes, 2 * x);
  const Arrival s4 = arrive(0, 4, kFloats);
  EXPECT_EQ(s4.base, s1.base) << "step 1's mapping takes step 4";
  EXPECT_LT(s4.faults, 16);
  const Arrival s5 = arrive(0, 5, kFloats);
  EXPECT_EQ(s5.base, s2.base);
  EXPECT_LT(s5.faults, 16);
  daemon::ReplicaStats st = store.Stats();
  EXPECT_EQ(st.reused, 2u);
  EXPECT_EQ(st.used_bytes, 2 * x);
  EXPECT_EQ(st.spare_bytes, x);  // step 3's
  EXPECT_LE(st.used_bytes + st.spare_bytes, 3 * x + x / 2);
  // Rank 1's copy of another size does not fit beside the spare: the spare
  // gives way, no held copy does.
  const uint64_t floats1 = kFloats + kFloats / 4;
  const uint64_t y = ReplicaImage("j", 1, 1, 2, floats1).image.size();
  ASSERT_GT(2 * x + x + y, 3 * x + x / 2);
  const Arrival r1 = arrive(1, 1, floats1);
  ASSERT_NE(r1.base, nullptr);
  st = store.Stats();
  // Not the spare: that was unmapped (a fresh mapping may land where it
  // was, so the address says nothing).
  EXPECT_EQ(st.reused, 2u);
  EXPECT_EQ(st.spare_bytes, 0u);
  EXPECT_EQ(st.used_bytes, 2 * x + y);
  EXPECT_EQ(st.held, 3u);
  EXPECT_NE(store.Find("j", 4, 0), nullptr);
  EXPECT_NE(store.Find("j", 5, 0), nullptr);
  EXPECT_NE(store.Find("j", 1, 1), nullptr);
}

TEST_F(ReplicaHolderTest, BadInputIsRefusedNamingTheFieldAndServingGoesOn) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 3, 1, 2);
  auto first = [&](rv1::ShardCopy c, uint64_t offset, std::string data) {
    rv1::PutChunk p;
    *p.mutable_copy() = std::move(c);
    p.set_offset(offset);
    p.set_data(std::move(data));
    return p;
  };
  auto data = [&](uint64_t offset, std::string bytes) {
    rv1::PutChunk p;
    p.set_offset(offset);
    p.set_data(std::move(bytes));
    return p;
  };
  auto expect = [](const grpc::Status& st, const std::string& field) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << field << ": " << st.error_message();
    EXPECT_EQ(st.error_message().rfind(field, 0), 0u)
        << "want '" << field << "' first: " << st.error_message();
  };
  const std::string img(s.image.begin(), s.image.end());
  expect(RawPut({}), "copy");
  expect(RawPut({data(0, img)}), "copy");
  rv1::ShardCopy c = CopyOf(s);
  c.set_job("../etc");
  expect(RawPut({first(c, 0, img)}), "copy.job");
  c = CopyOf(s);
  c.set_rank(2);
  expect(RawPut({first(c, 0, img)}), "copy.rank");
  c = CopyOf(s);
  c.set_image_bytes(s.image.size() + 1);
  expect(RawPut({first(c, 0, img)}), "copy.image_bytes");
  c = CopyOf(s);
  c.clear_checksums();
  expect(RawPut({first(c, 0, img)}), "copy.checksums");
  expect(RawPut({first(CopyOf(s), 4096, img.substr(4096))}), "offset");
  expect(RawPut({first(CopyOf(s), 0,
                       std::string(daemon::kMaxReplicaChunkBytes + 1, 'x'))}),
         "data");
  expect(RawPut({first(CopyOf(s), 0, img), data(img.size(), "x")}), "data");
  expect(RawPut({first(CopyOf(s), 0, img.substr(0, 8192))}), "data");
  rv1::GetRequest bad;
  bad.set_job("");
  grpc::ClientContext ctx;
  rv1::GetChunk chunk;
  auto reader = rv1::Replica::NewStub(Channel())->Get(&ctx, bad);
  while (reader->Read(&chunk)) {
  }
  expect(reader->Finish(), "job");
  EXPECT_EQ(Get("j", 9, 1).status().code(), absl::StatusCode::kNotFound);
  // None of it held anything, and the listener still serves.
  EXPECT_EQ(store_->Stats().used_bytes, 0u);
  ASSERT_TRUE(Put(CopyOf(s), s.image).ok());
  EXPECT_TRUE(Get("j", 3, 1).ok());
}

#ifdef MAKE_CERTS_SCRIPT
TEST_F(ReplicaHolderTest, OnlyPeersWithTheClustersCertificateGetIn) {
  const std::string certs = dir_.path() + "/certs";
  const std::string cmd =
      std::string("sh ") + MAKE_CERTS_SCRIPT + " " + certs + " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl failed";
  auto files = [&](const std::string& name, const std::string& ca) {
    coordinator::TlsFiles t;
    t.cert = certs + "/" + name + ".pem";
    t.key = certs + "/" + name + ".key";
    t.ca = certs + "/" + ca + ".pem";
    return t;
  };
  StartHolder(1ull << 30, files("n2", "ca"));
  const storage::Shard s = ReplicaImage("j", 1, 0, 2);
  // A node of the cluster's CA puts and gets.
  auto n1 = Channel(files("n1", "ca"), "n2");
  ASSERT_TRUE(Put(CopyOf(s, 1, "n1"), s.image, n1.get()).ok());
  // A certificate of another CA, or none at all, gets nowhere.
  auto other = Channel(files("n1-other", "other-ca"), "n2");
  auto refused = Put(CopyOf(s, 2, "n1"), s.image, other.get());
  EXPECT_FALSE(refused.ok());
  auto plain = Channel();
  EXPECT_FALSE(Put(CopyOf(s, 2, "n1"), s.image, plain.get()).ok());
  // A node cannot put a copy in another node's name.
  auto forged = Put(CopyOf(s, 2, "n2"), s.image, n1.get());
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(forged.status().message().find("copy.source_node"),
            std::string::npos);
  EXPECT_EQ(replicated_.load(), 1);
}
#endif

}  // namespace
}  // namespace ckpt::testing
