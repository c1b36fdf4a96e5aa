#include "storage/manifest.h"

#include "gtest/gtest.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "tests/temp_dir.h"
#include "util/checksum.h"

namespace ckpt::storage {
namespace {

v1::NodeManifest TwoRanks(std::string_view node = "") {
  v1::NodeManifest m;
  m.set_job("j");
  m.set_step(42);
  m.set_world_size(2);
  for (uint32_t r = 0; r < 2; ++r) {
    v1::NodeManifestShard* s = m.add_shards();
    s->set_rank(r);
    s->set_key(ShardKey("j", 42, r, node));
    s->set_bytes(8192 + r);
    s->set_tensors(3);
    s->set_checksums_digest(DigestHex(0xabc0 + r));
  }
  return m;
}

TEST(NodeManifest, RoundTripsWithTheFieldNamesCkptdHasAlwaysWritten) {
  const std::string key = ManifestKey("j", 42);
  std::string json = EncodeNodeManifest(TwoRanks());
  for (const char* field :
       {"\"format\":\"ckptd-manifest-v1\"", "\"world_size\":2", "\"shards\":[",
        "\"checksums_digest\":\"000000000000abc1\"", "\"tensors\":3"})
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  absl::StatusOr<v1::NodeManifest> back = DecodeNodeManifest(json, key);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shards(1).bytes(), 8193u);
  EXPECT_EQ(back->shards(1).checksums_digest(), "000000000000abc1");
}

// The text engine_persist.cc wrote before the schema existed: numbers, not
// strings, for step and bytes.
TEST(NodeManifest, FilesWrittenBeforeTheSchemaStillParse) {
  const std::string old = absl::StrCat(
      R"({"format":"ckptd-manifest-v1","job":"j","step":42,"world_size":1,"shards":[)",
      R"({"rank":0,"key":")", ShardKey("j", 42, 0),
      R"(","bytes":12288,"tensors":2,)",
      R"("checksums_digest":"0123456789abcdef"}]})", "\n");
  absl::StatusOr<v1::NodeManifest> m =
      DecodeNodeManifest(old, ManifestKey("j", 42));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->step(), 42u);
  EXPECT_EQ(m->shards(0).bytes(), 12288u);
  EXPECT_EQ(m->shards(0).tensors(), 2u);
}

TEST(NodeManifest, ANodesManifestListsOnlyItsRanks) {
  v1::NodeManifest m = TwoRanks("n1");
  m.set_world_size(4);
  EXPECT_TRUE(
      DecodeNodeManifest(EncodeNodeManifest(m), ManifestKey("j", 42, "n1"))
          .ok());
  // The one-node layout must list every rank.
  absl::StatusOr<v1::NodeManifest> one =
      DecodeNodeManifest(EncodeNodeManifest(m), ManifestKey("j", 42));
  EXPECT_EQ(one.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(
      one.status().message().find("shards: lists 2 shards for world_size 4"),
      absl::string_view::npos)
      << one.status();
}

TEST(NodeManifest, DecodeRefusesNamingTheField) {
  const std::string key = ManifestKey("j", 42);
  auto expect = [&](const std::string& json, const std::string& field) {
    absl::StatusOr<v1::NodeManifest> d = DecodeNodeManifest(json, key);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << field;
    EXPECT_NE(d.status().message().find(field), absl::string_view::npos)
        << d.status();
    EXPECT_NE(d.status().message().find(key), absl::string_view::npos)
        << d.status();
  };
  v1::NodeManifest m = TwoRanks();
  m.set_format("ckptd-manifest-v9");
  expect(EncodeNodeManifest(m), "format: \"ckptd-manifest-v9\"");
  m = TwoRanks();
  m.set_step(43);
  expect(EncodeNodeManifest(m), "job/step");
  m = TwoRanks();
  m.set_job("k");
  expect(EncodeNodeManifest(m), "job/step");
  m = TwoRanks();
  m.mutable_shards(1)->set_rank(0);
  expect(EncodeNodeManifest(m), "shards[1].rank: 0 is listed twice");
  m = TwoRanks();
  m.mutable_shards(1)->set_rank(2);
  expect(EncodeNodeManifest(m), "shards[1].rank: 2, world_size is 2");
  m = TwoRanks();
  m.mutable_shards(0)->set_key("../etc/passwd");
  expect(EncodeNodeManifest(m), "shards[0].key");
  m = TwoRanks();
  m.mutable_shards(0)->set_key(ShardKey("j", 42, 1));
  expect(EncodeNodeManifest(m), "shards[0].key");
  m = TwoRanks();
  m.mutable_shards(1)->set_checksums_digest("xyz");
  expect(EncodeNodeManifest(m), "shards[1].checksums_digest");
  m = TwoRanks();
  m.set_world_size(0);
  expect(EncodeNodeManifest(m), "world_size: 0");
  // The layout index is checked whole: a bad blob, or one of another
  // world size.
  m = TwoRanks();
  m.set_layout_index("CKLI garbage");
  expect(EncodeNodeManifest(m), "layout_index: layout index");
  m = TwoRanks();
  {
    LayoutIndexBuilder b(3);
    const uint64_t shape[] = {4};
    ASSERT_TRUE(b.AddTensor("w", DType::kFloat32, shape).ok());
    m.set_layout_index(SerializeLayoutIndex(*std::move(b).Finish()));
  }
  expect(EncodeNodeManifest(m),
         "layout_index: world_size 3, the manifest's is 2");
  expect("{\"format\": not json", "does not parse");
  expect("[]", "does not parse");
  // A key that is not a node manifest's is the caller's error.
  EXPECT_EQ(DecodeNodeManifest(EncodeNodeManifest(TwoRanks()),
                               GlobalManifestKey("j", 42))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The chunk hashes of a shard entry (doc/resharding.md, "A lost node's
// saved rank"): they survive the JSON round trip, are bounded when the
// manifest is decoded and checked against the shard's index when used,
// each refusal naming the field.
TEST(NodeManifest, ChunkHashesRoundTripAndAreCheckedAgainstTheIndex) {
  const std::string key = ManifestKey("j", 42);
  ShardInfo info;
  ShardTensor a, b;
  a.name = "a";
  a.bytes = 100;
  b.name = "rows";
  b.bytes = 2 * kChecksumChunk + 5;  // 3 chunks
  const std::vector<uint64_t> hashes = {0x1122334455667788, 7,
                                        0xfedcba9876543210};
  b.checksum = CombineChunkHashes(hashes);
  info.tensors = {a, b};
  v1::NodeManifest m = TwoRanks();
  m.mutable_shards(1)->set_bytes(4 * kChecksumChunk);
  AddChunkHashes(m.mutable_shards(1), 1, hashes);
  absl::StatusOr<v1::NodeManifest> back =
      DecodeNodeManifest(EncodeNodeManifest(m), key);
  ASSERT_TRUE(back.ok()) << back.status();
  auto got = ManifestChunkHashes(back->shards(1), info, "M: shards[1]");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ(got->at(1), hashes);
  // A manifest of an older daemon has none: an empty map.
  got = ManifestChunkHashes(back->shards(0), info, "M: shards[0]");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->empty());

  auto expect_decode = [&](const v1::NodeManifest& bad,
                           const std::string& field) {
    absl::StatusOr<v1::NodeManifest> d =
        DecodeNodeManifest(EncodeNodeManifest(bad), key);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << field;
    EXPECT_NE(d.status().message().find(field), absl::string_view::npos)
        << d.status();
  };
  v1::NodeManifest bad = m;
  bad.mutable_shards(1)->mutable_chunk_hashes(0)->mutable_hashes()->resize(7);
  expect_decode(bad, "shards[1].chunk_hashes[0].hashes: 7 bytes");
  bad = m;
  bad.mutable_shards(1)->mutable_chunk_hashes(0)->set_tensor(3);
  expect_decode(bad, "shards[1].chunk_hashes[0].tensor: 3, the shard has 3");
  bad = m;
  AddChunkHashes(bad.mutable_shards(1), 0, {{1, 2}});
  expect_decode(bad, "shards[1].chunk_hashes[1].tensor: 0 is not after 1");
  bad = m;  // more hashes than 4 MiB of image hold (4 + 1 per entry)
  bad.mutable_shards(1)->clear_chunk_hashes();
  AddChunkHashes(bad.mutable_shards(1), 1, std::vector<uint64_t>(6, 1));
  expect_decode(bad, "shards[1].chunk_hashes: 6 hashes, more than");

  auto expect_use = [&](const v1::NodeManifest& bad, const std::string& field) {
    auto d = ManifestChunkHashes(bad.shards(1), info, "M: shards[1]");
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << field;
    EXPECT_NE(d.status().message().find(field), absl::string_view::npos)
        << d.status();
  };
  bad = m;  // two hashes for a tensor of three chunks
  bad.mutable_shards(1)->clear_chunk_hashes();
  AddChunkHashes(bad.mutable_shards(1), 1, {{hashes[0], hashes[1]}});
  expect_use(bad,
             "M: shards[1].chunk_hashes[0].hashes (tensor \"rows\"): 16 "
             "bytes, 3 chunks");
  bad = m;  // one hash changed: they no longer combine into the checksum
  (*bad.mutable_shards(1)->mutable_chunk_hashes(0)->mutable_hashes())[9] ^= 1;
  expect_use(bad,
             "M: shards[1].chunk_hashes[0].hashes (tensor \"rows\"): they "
             "do not combine into its checksum");
  bad = m;  // a tensor the index does not have
  info.tensors.pop_back();
  expect_use(bad,
             "M: shards[1].chunk_hashes[0].tensor: 1, the shard's index "
             "has 1 tensors");
}

TEST(NodeManifest, ProblemsListsEveryProblem) {
  v1::NodeManifest m = TwoRanks();
  m.mutable_shards(0)->set_rank(5);
  m.mutable_shards(1)->set_checksums_digest("no");
  std::vector<std::string> p = NodeManifestProblems(m, ManifestKey("j", 42));
  EXPECT_EQ(p.size(),
            3u);  // rank out of range, its key not of rank 5, the digest
}

TEST(GlobalManifest, RoundTripsAndKeepsItsCamelCaseNames) {
  v1::GlobalManifest m;
  m.set_format(kGlobalManifestFormat);
  m.set_job("j");
  m.set_step(7);
  m.set_world_size(1);
  v1::ManifestShard* s = m.add_shards();
  s->set_key(ShardKey("j", 7, 0, "n1"));
  s->set_bytes(4096);
  s->set_checksum_digest(DigestHex(1));
  s->set_node_id("n1");
  std::string json = EncodeGlobalManifest(m);
  EXPECT_NE(json.find("\"worldSize\":1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"checksumDigest\""), std::string::npos) << json;
  auto back = DecodeGlobalManifest(json, GlobalManifestKey("j", 7), "j", 7);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->shards(0).node_id(), "n1");
  m.mutable_shards(0)->set_key("/abs/path");
  EXPECT_EQ(DecodeGlobalManifest(EncodeGlobalManifest(m), "k", "j", 7)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

TEST(Manifests, WriteAndReadBackThroughABackend) {
  ckpt::testing::TempDir dir;
  LocalBackendOptions o;
  o.root = dir.path();
  auto b = NewLocalBackend(o);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(WriteNodeManifest(**b, TwoRanks("n1"), "n1").ok());
  auto m = ReadNodeManifest(**b, ManifestKey("j", 42, "n1"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shards_size(), 2);
  EXPECT_EQ(ReadNodeManifest(**b, ManifestKey("j", 42)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadGlobalManifest(**b, "j", 42).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Manifests, ChecksumsDigestIsTheDocumentedFormula) {
  const uint64_t sums[] = {1, 2, 3};
  EXPECT_EQ(ChecksumsDigest(sums), ((1 * 1000003ull) ^ 2) * 1000003ull ^ 3);
  EXPECT_EQ(ChecksumsDigest(std::span<const uint64_t>()), 0u);
  ShardInfo info;
  for (uint64_t c : sums) {
    ShardTensor t;
    t.checksum = c;
    info.tensors.push_back(t);
  }
  EXPECT_EQ(ChecksumsDigest(info), ChecksumsDigest(sums));
}

}  // namespace
}  // namespace ckpt::storage
