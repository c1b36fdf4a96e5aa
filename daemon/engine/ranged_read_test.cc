// ranged_read.h: the ranges a ranged peer fetch takes (checked as input,
// naming the field) and the checksum chunks they touch, which the holder
// sends and the receiver verifies.
#include "daemon/replica/ranged_read.h"

#include <gtest/gtest.h>

#include <vector>

#include "util/checksum.h"

namespace ckpt::daemon {
namespace {

absl::Status RangesStatus(std::vector<uint64_t> off, std::vector<uint64_t> len,
                          std::optional<uint64_t> image = 1000) {
  return ValidateRanges(off, len, image, "ranges").status();
}

TEST(RangedReadTest, RangesAreRefusedNamingTheField) {
  EXPECT_TRUE(RangesStatus({0, 10}, {10, 5}).ok());
  EXPECT_TRUE(RangesStatus({990}, {10}).ok());
  EXPECT_EQ(RangesStatus({0, 1}, {1}).message(),
            "ranges: 2 offsets and 1 lengths");
  EXPECT_EQ(RangesStatus({5}, {0}).message(), "ranges[0].length: 0 bytes");
  EXPECT_EQ(RangesStatus({995}, {10}).message(),
            "ranges[0]: bytes [995, +10) past image_bytes 1000");
  EXPECT_EQ(RangesStatus({1}, {UINT64_MAX}, std::nullopt).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RangesStatus({10, 12}, {5, 1}).message(),
            "ranges[1].offset: 12, before the end of the range before it "
            "(15): ranges are sorted and disjoint");
  std::vector<uint64_t> many(kMaxRanges + 1, 0);
  EXPECT_EQ(RangesStatus(many, many).message(),
            "ranges: 65537 ranges, at most 65536");
}

TEST(RangedReadTest, TouchedChunksAreTheChunksOfEachTensorTheRangesCross) {
  storage::ShardInfo info;
  const uint64_t mib = kChecksumChunk;
  info.tensors.resize(3);
  info.tensors[0].offset = 8192;  // 2.5 MiB: chunks 0, 1, 2 (half)
  info.tensors[0].bytes = 5 * mib / 2;
  info.tensors[1].offset = 8192 + 3 * mib;  // empty
  info.tensors[1].bytes = 0;
  info.tensors[2].offset = 8192 + 3 * mib;  // 100 bytes: one chunk
  info.tensors[2].bytes = 100;
  std::vector<ImageRange> ranges = {
      {0, 8193},                      // header, index, tensor 0's byte 0
      {8192 + 10, 5},                 // chunk 0 again: listed once
      {8192 + 2 * mib - 1, 2},        // the end of chunk 1, start of 2
      {8192 + 5 * mib / 2, mib / 2},  // padding only: nothing
      {8192 + 3 * mib + 99, 1}};      // the last byte of tensor 2
  const std::vector<TouchedChunk> got = TouchedChunks(info, ranges);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].tensor, 0u);
  EXPECT_EQ(got[0].chunk, 0u);
  EXPECT_EQ(got[0].at, 8192u);
  EXPECT_EQ(got[0].bytes, mib);
  EXPECT_EQ(got[1].chunk, 1u);
  EXPECT_EQ(got[2].chunk, 2u);
  EXPECT_EQ(got[2].bytes, mib / 2);  // a tensor's last chunk is shorter
  EXPECT_EQ(got[3].tensor, 2u);
  EXPECT_EQ(got[3].chunk, 0u);
  EXPECT_EQ(got[3].bytes, 100u);
  EXPECT_TRUE(TouchedChunks(info, {}).empty());
}

}  // namespace
}  // namespace ckpt::daemon
