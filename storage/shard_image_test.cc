// The in-memory shard image validator and checksum verifier
// (shard_image.h): a good image passes and yields its index; a damaged,
// short or foreign one is DataLoss naming what and where.
#include "storage/shard_image.h"

#include <cstring>

#include "gtest/gtest.h"
#include "storage/shard_testing.h"

namespace ckpt::storage {
namespace {

const ImageExpect kExpect{"job-a", 42, 1};

bool Has(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string_view::npos;
}

TEST(ShardImageTest, AGoodImageValidatesAndYieldsItsIndex) {
  Shard s = MakeShard({{1000}, {0}, {17, 3}});
  absl::StatusOr<ShardInfo> info = ValidateImage(s.image, kExpect, "slot 0");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensors.size(), 3u);
  EXPECT_EQ(info->created_unix_ns, 123456789u);
  EXPECT_TRUE(SameIndex(*info, s.info, {}, "slot 0").ok());
  EXPECT_TRUE(VerifyTensorChecksums(s.image.data(), *info, "slot 0").ok());
}

TEST(ShardImageTest, BadMagicIsDataLossNamingTheImage) {
  Shard s = MakeShard({{1000}});
  s.image[0] = 'X';
  absl::StatusOr<ShardInfo> info = ValidateImage(s.image, kExpect, "slot 3");
  ASSERT_EQ(info.status().code(), absl::StatusCode::kDataLoss) << info.status();
  EXPECT_TRUE(Has(info.status(), "slot 3: ")) << info.status();
  EXPECT_TRUE(Has(info.status(), "magic")) << info.status();
}

TEST(ShardImageTest, AShortImageIsDataLossSayingHowShort) {
  Shard s = MakeShard({{1000}});
  absl::StatusOr<ShardInfo> info = ValidateImage(
      std::span<const char>(s.image.data(), kShardAlign), kExpect, "k");
  ASSERT_EQ(info.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(info.status(), "k: too short: 4096 bytes")) << info.status();
  // Whole blocks, but not the whole shard: the footer is not where the
  // header says.
  info = ValidateImage(
      std::span<const char>(s.image.data(), s.image.size() - kShardAlign),
      kExpect, "k");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDataLoss) << info.status();
}

TEST(ShardImageTest, AnImageOfAnotherShardIsRefusedNamingBoth) {
  Shard s = MakeShard({{1000}});
  absl::StatusOr<ShardInfo> info =
      ValidateImage(s.image, ImageExpect{"job-a", 43, 1}, "slot 1");
  ASSERT_EQ(info.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(info.status(),
                  "holds job 'job-a' step 42 rank 1, not "
                  "job 'job-a' step 43 rank 1"))
      << info.status();
}

TEST(ShardImageTest, AWrongChecksumNamesTheTensor) {
  Shard s = MakeShard({{1000}, {64}});
  s.image[s.info.tensors[1].offset + 5] ^= 1;
  absl::Status v = VerifyTensorChecksums(s.image.data(), s.info, "j/r1");
  ASSERT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Has(v, "j/r1: tensor \"layer1.weight\": checksum mismatch")) << v;
  // A tensor whose checksum is not known (a device tensor at commit) is
  // not checked.
  EXPECT_TRUE(
      VerifyTensorChecksums(s.image.data(), s.info, "j/r1", {true, false})
          .ok());
}

TEST(ShardImageTest, AnotherIndexNamesTheTensorThatDiffers) {
  Shard s = MakeShard({{1000}, {64}});
  ShardInfo want = s.info;
  want.tensors[1].checksum ^= 1;
  absl::Status d = SameIndex(s.info, want, {}, "f");
  EXPECT_TRUE(Has(d, "f: tensor \"layer1.weight\" differs")) << d;
  // An unknown checksum is not compared.
  EXPECT_TRUE(SameIndex(s.info, want, {true, false}, "f").ok());
  // So is a copy that places a tensor elsewhere in its global tensor.
  want = s.info;
  want.tensors[0].global_shape = {2000};
  want.tensors[0].piece_offsets = {1000};
  EXPECT_TRUE(Has(SameIndex(s.info, want, {}, "f"),
                  "f: tensor \"layer0.weight\" differs"));
  want.tensors.pop_back();
  EXPECT_TRUE(Has(SameIndex(s.info, want, {}, "f"), "2 tensors, expected 1"));
}

}  // namespace
}  // namespace ckpt::storage
