#include "storage/manifest_json.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"

namespace ckpt::storage {
namespace {

// What EncodeGlobalManifest wrote before it had its own encoder.
std::string Protobuf(const v1::GlobalManifest& m) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(m, &json, opts).ok());
  return json + "\n";
}

// EncodeGlobalManifest prints protobuf's bytes, and does it with the
// hand-written encoder exactly when `fast` (else the equality would hold
// only because it fell back).
void ExpectSame(const v1::GlobalManifest& m, bool fast) {
  const std::string want = Protobuf(m);
  EXPECT_EQ(EncodeGlobalManifest(m), want);
  std::optional<std::string> json = GlobalManifestJson(m);
  ASSERT_EQ(json.has_value(), fast) << want;
  if (json) {
    EXPECT_EQ(*json, want);
  }
}

v1::GlobalManifest Full() {
  v1::GlobalManifest m;
  m.set_format(kGlobalManifestFormat);
  m.set_job("job-7");
  m.set_step(123456789);
  m.set_world_size(3);
  m.set_generation(5);
  m.set_fence(77);
  for (uint32_t r = 0; r < 3; ++r) {
    v1::ManifestShard* s = m.add_shards();
    s->set_rank(r);
    s->set_key(ShardKey("job-7", 123456789, r, "node-01"));
    s->set_bytes(4096 * (r + 1));
    s->set_checksum_digest(DigestHex(0xabcdef00 + r));
    s->set_node_id("node-01");
  }
  return m;
}

TEST(GlobalManifestJson, EmptyManifestIsProtobufs) {
  ExpectSame(v1::GlobalManifest(), true);
}

TEST(GlobalManifestJson, EveryFieldAndEveryBase64Padding) {
  v1::GlobalManifest m = Full();
  ExpectSame(m, true);
  // 0..5 bytes cover no padding, "==" and "="; every byte value and a few
  // KB of random ones cover the alphabet ('+' and '/' included).
  std::string bytes;
  for (int c = 0; c < 256; ++c) bytes += static_cast<char>(c);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; ++i) bytes += static_cast<char>(rng());
  for (size_t n : {0, 1, 2, 3, 4, 5, 256, 257, 258, 5255, 5256}) {
    m.set_layout_index(bytes.substr(0, n));
    ExpectSame(m, true);
  }
  v1::GlobalManifest empty;
  empty.set_layout_index("");  // set though empty: printed as ""
  ExpectSame(empty, true);
}

TEST(GlobalManifestJson, ZeroValuesArePrinted) {
  v1::GlobalManifest m;
  m.set_format(kGlobalManifestFormat);
  m.add_shards();  // rank 0, bytes 0, empty strings
  v1::ManifestShard* s = m.add_shards();
  s->set_key("k");
  ExpectSame(m, true);
}

TEST(GlobalManifestJson, LargestValues) {
  constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
  constexpr uint32_t kMax32 = std::numeric_limits<uint32_t>::max();
  v1::GlobalManifest m = Full();
  m.set_step(kMax64);
  m.set_world_size(kMax32);
  m.set_generation(kMax64);
  m.set_fence(kMax64 - 1);
  m.mutable_shards(0)->set_rank(kMax32);
  m.mutable_shards(0)->set_bytes(kMax64);
  ExpectSame(m, true);
}

// A string protobuf escapes, or one not printable ASCII, in any string
// field: the whole message is protobuf's (invalid UTF-8 included, which
// protobuf drops).
TEST(GlobalManifestJson, FallsBackOnWhatProtobufEscapes) {
  for (std::string_view bad :
       {"\x01", "a\tb", "\x7f", "caf\xc3\xa9", "\xff", "\"", "\\", "<", ">"}) {
    for (int field = 0; field < 5; ++field) {
      v1::GlobalManifest m = Full();
      std::string* s[] = {m.mutable_format(), m.mutable_job(),
                          m.mutable_shards(1)->mutable_key(),
                          m.mutable_shards(2)->mutable_checksum_digest(),
                          m.mutable_shards(0)->mutable_node_id()};
      s[field]->append(bad);
      SCOPED_TRACE(::testing::Message() << "field " << field << " " << bad);
      ExpectSame(m, false);
    }
  }
  // '&', '\'' and '=' are copied as they are by this protobuf.
  v1::GlobalManifest m = Full();
  m.set_job("a&b'c=d");
  ExpectSame(m, true);
}

TEST(GlobalManifestJson, FallsBackOnUnknownFields) {
  v1::GlobalManifest m = Full();
  m.GetReflection()->MutableUnknownFields(&m)->AddVarint(99, 1);
  ExpectSame(m, false);
  m = Full();
  v1::ManifestShard* s = m.mutable_shards(1);
  s->GetReflection()->MutableUnknownFields(s)->AddVarint(99, 1);
  ExpectSame(m, false);
}

TEST(GlobalManifestJson, RandomManifestsAreProtobufs) {
  std::mt19937_64 rng(20240611);
  auto below = [&](uint64_t n) { return rng() % n; };
  auto number = [&]() -> uint64_t {
    switch (below(4)) {
      case 0:
        return 0;
      case 1:
        return below(1000);
      case 2:
        return std::numeric_limits<uint64_t>::max() - below(3);
      default:
        return rng() >> below(64);
    }
  };
  int fast = 0;
  for (int i = 0; i < 1000; ++i) {
    // Most manifests draw from printable ASCII without the four characters
    // protobuf escapes ('&', '\'', '=' included); the others from all of
    // printable ASCII, so they almost always fall back.
    const bool plain = below(10) < 7;
    auto text = [&] {
      std::string s(below(40), ' ');
      for (char& c : s) {
        do {
          c = static_cast<char>(0x20 + below(0x7f - 0x20));
        } while (plain && (c == '"' || c == '\\' || c == '<' || c == '>'));
      }
      return s;
    };
    v1::GlobalManifest m;
    m.set_format(text());
    m.set_job(text());
    m.set_step(number());
    m.set_world_size(static_cast<uint32_t>(number()));
    m.set_generation(number());
    m.set_fence(number());
    for (uint64_t n = below(9); n > 0; --n) {
      v1::ManifestShard* s = m.add_shards();
      s->set_rank(static_cast<uint32_t>(number()));
      s->set_key(text());
      s->set_bytes(number());
      s->set_checksum_digest(text());
      s->set_node_id(text());
    }
    if (below(2)) {
      std::string index(below(100), '\0');
      for (char& c : index) c = static_cast<char>(rng());
      m.set_layout_index(index);
    }
    const std::string want = Protobuf(m);
    ASSERT_EQ(EncodeGlobalManifest(m), want) << "manifest " << i;
    std::optional<std::string> json = GlobalManifestJson(m);
    if (plain) {
      ASSERT_TRUE(json.has_value()) << want;
    }
    if (json) {
      ASSERT_EQ(*json, want) << "manifest " << i;
      ++fast;
    }
  }
  // Both paths taken, each many times.
  EXPECT_GT(fast, 600);
  EXPECT_LT(fast, 900);
}

TEST(GlobalManifestJson, DecodesBackToTheSameMessage) {
  v1::GlobalManifest m = Full();
  LayoutIndexBuilder b(3);
  const uint64_t shape[] = {4};
  ASSERT_TRUE(b.AddTensor("w", DType::kFloat32, shape).ok());
  absl::StatusOr<LayoutIndex> index = std::move(b).Finish();
  ASSERT_TRUE(index.ok()) << index.status();
  m.set_layout_index(SerializeLayoutIndex(*index));
  ASSERT_TRUE(GlobalManifestJson(m).has_value());
  absl::StatusOr<v1::GlobalManifest> back = DecodeGlobalManifest(
      EncodeGlobalManifest(m), GlobalManifestKey("job-7", 123456789), "job-7",
      123456789);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, m));
}

}  // namespace
}  // namespace ckpt::storage
