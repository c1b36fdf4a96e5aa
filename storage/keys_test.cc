#include "storage/keys.h"

#include "gtest/gtest.h"

namespace ckpt::storage {
namespace {

void ExpectRoundTrip(const ParsedKey& p, const std::string& expected_key) {
  std::string key = KeyOf(p);
  EXPECT_EQ(key, expected_key);
  absl::StatusOr<ParsedKey> back = ParseKey(key);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p) << key;
}

TEST(Keys, BuildersKeepTheFormatsOnStorage) {
  EXPECT_EQ(JobPrefix("job"), "job/");
  EXPECT_EQ(StepPrefix("job", 42), "job/step-00000000000000000042/");
  EXPECT_EQ(ShardKey("job", 42, 7),
            "job/step-00000000000000000042/rank-00007.shard");
  EXPECT_EQ(ShardKey("job", 42, 7, "n1"),
            "job/step-00000000000000000042/rank-00007.n1.shard");
  EXPECT_EQ(ManifestKey("job", 42), "job/step-00000000000000000042/MANIFEST");
  EXPECT_EQ(ManifestKey("job", 42, "n1"),
            "job/step-00000000000000000042/MANIFEST.n1");
  EXPECT_EQ(GlobalManifestKey("job", 42),
            "job/step-00000000000000000042/MANIFEST.global");
}

TEST(Keys, EveryKindRoundTripsThroughParseKey) {
  ExpectRoundTrip({KeyKind::kShard, "job", 42, 7, ""},
                  "job/step-00000000000000000042/rank-00007.shard");
  ExpectRoundTrip(
      {KeyKind::kShard, "j.b-1_x", UINT64_MAX, 1048575, "node.a-1"},
      "j.b-1_x/step-18446744073709551615/rank-1048575.node.a-1.shard");
  ExpectRoundTrip({KeyKind::kManifest, "job", 0, 0, ""},
                  "job/step-00000000000000000000/MANIFEST");
  ExpectRoundTrip({KeyKind::kManifest, "job", 3, 0, "n2"},
                  "job/step-00000000000000000003/MANIFEST.n2");
  ExpectRoundTrip({KeyKind::kGlobalManifest, "job", 9, 0, ""},
                  "job/step-00000000000000000009/MANIFEST.global");
}

TEST(Keys, ParseStepDirReadsTwentyDigits) {
  EXPECT_EQ(*ParseStepDir("step-00000000000000000042"), 42u);
  EXPECT_FALSE(ParseStepDir("step-42").ok());
  EXPECT_FALSE(ParseStepDir("step-99999999999999999999").ok());  // past uint64
}

// Each refusal names the part that is wrong.
TEST(Keys, MalformedKeysAreRefusedNamingThePart) {
  struct Case {
    const char* key;
    const char* part;
  };
  const std::string step = "step-00000000000000000001";
  for (const Case& c : std::vector<Case>{
           {"job", "is not \"<job>/step-<20 digits>/<name>\""},
           {"job/step-00000000000000000001", "is not"},
           {"a/b/step-00000000000000000001/MANIFEST", "is not"},
           {"/step-00000000000000000001/MANIFEST", "job: empty"},
           {"-j/step-00000000000000000001/MANIFEST", "job: may not start"},
           {"j/step-1/MANIFEST", "step: \"step-1\""},
           {"j/step-0000000000000000000x/MANIFEST", "step:"},
           {"j/steps-00000000000000000001/MANIFEST", "step:"},
           {"j/step-00000000000000000001/rank-0.shard", "rank: \"rank-0\""},
           {"j/step-00000000000000000001/rank-000001.shard", "rank:"},
           {"j/step-00000000000000000001/rank-99999999999.shard", "rank:"},
           {"j/step-00000000000000000001/rank-00001.shard.tmp", "name:"},
           {"j/step-00000000000000000001/rank-00001..shard", "node: empty"},
           {"j/step-00000000000000000001/rank-00001.n/x.shard", "is not"},
           {"j/step-00000000000000000001/rank-00001.n$.shard",
            "node: character 0x24"},
           {"j/step-00000000000000000001/MANIFEST.", "node: empty"},
           {"j/step-00000000000000000001/MANIFEST..x", "node:"},
           {"j/step-00000000000000000001/manifest", "name: \"manifest\""},
       }) {
    absl::StatusOr<ParsedKey> p = ParseKey(c.key);
    ASSERT_FALSE(p.ok()) << c.key;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_NE(std::string(p.status().message()).find(c.part), std::string::npos)
        << c.key << " -> " << p.status();
  }
}

TEST(Keys, ARefusalQuotesOnlyAPrefixOfAHugeKey) {
  std::string huge = "j/step-00000000000000000001/" + std::string(100000, 'x');
  absl::StatusOr<ParsedKey> p = ParseKey(huge);
  ASSERT_FALSE(p.ok());
  EXPECT_LT(p.status().message().size(), 400u);
}

TEST(Keys, ANodeMayNotBeNamedGlobal) {
  EXPECT_TRUE(ValidateNodeId("n1").ok());
  absl::Status s = ValidateNodeId("global", "--node-id");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--node-id: \"global\" is reserved"),
            absl::string_view::npos)
      << s;
  EXPECT_FALSE(ValidateNodeId("a/b").ok());
  EXPECT_FALSE(
      ParseKey("j/step-00000000000000000001/rank-00001.global.shard").ok());
}

TEST(Keys, IsShardKeyOfAcceptsEveryNodeButOnlyThatShard) {
  EXPECT_TRUE(IsShardKeyOf(ShardKey("j", 5, 3), "j", 5, 3));
  EXPECT_TRUE(IsShardKeyOf(ShardKey("j", 5, 3, "n1"), "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf(ShardKey("j", 5, 4), "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf(ShardKey("j", 6, 3), "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf(ShardKey("k", 5, 3), "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf(ManifestKey("j", 5, "n1"), "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf("j/step-00000000000000000005/rank-00003.../x.shard",
                            "j", 5, 3));
  EXPECT_FALSE(IsShardKeyOf("../j/step-00000000000000000005/rank-00003.shard",
                            "j", 5, 3));
}

}  // namespace
}  // namespace ckpt::storage
