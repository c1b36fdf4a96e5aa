// The per-rank layout indexes a shard report carries and their merge into
// the step's index (storage/layout_merge.h).
#include "storage/layout_merge.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "storage/layout_format.h"
#include "storage/layout_testing.h"

namespace ckpt::storage {
namespace {

// 4 ranks: "w" [8, 6] row-sharded (rank 1 holds two pieces), "b" [6] a
// replica on every rank, "c" [4, 4] in 2 x 2 blocks on ranks 0 and 3.
std::vector<std::vector<v1::TensorMeta>> FourRanks() {
  std::vector<std::vector<v1::TensorMeta>> m(4);
  m[0] = {testing::Float32Piece("w", {2, 6}, {8, 6}, {0, 0}, 4096),
          testing::Float32Piece("b", {6}),
          testing::Float32Piece("c0", {2, 2}, {4, 4}, {0, 0}, 8192),
          testing::Float32Piece("c1", {2, 2}, {4, 4}, {0, 2}, 12288)};
  m[1] = {testing::Float32Piece("w0", {1, 6}, {8, 6}, {2, 0}, 4096),
          testing::Float32Piece("w1", {1, 6}, {8, 6}, {3, 0}, 8192),
          testing::Float32Piece("b", {6})};
  m[2] = {testing::Float32Piece("w", {2, 6}, {8, 6}, {4, 0}, 4096),
          testing::Float32Piece("b", {6})};
  m[3] = {testing::Float32Piece("w", {2, 6}, {8, 6}, {6, 0}, 4096),
          testing::Float32Piece("b", {6}),
          testing::Float32Piece("c0", {2, 2}, {4, 4}, {2, 0}, 8192),
          testing::Float32Piece("c1", {2, 2}, {4, 4}, {2, 2}, 12288)};
  for (auto& rank : m)
    for (auto& t : rank)
      if (t.name() == "w0" || t.name() == "w1")
        t.set_global_name("w");
      else if (t.name() == "c0" || t.name() == "c1")
        t.set_global_name("c");
  return m;
}

std::vector<std::string> Blobs(
    const std::vector<std::vector<v1::TensorMeta>>& m) {
  std::vector<std::string> out;
  for (uint32_t r = 0; r < m.size(); ++r) {
    absl::StatusOr<std::string> b = RankLayoutIndex(m.size(), r, m[r]);
    EXPECT_TRUE(b.ok()) << b.status();
    out.push_back(b.ok() ? *b : std::string());
  }
  return out;
}

absl::StatusOr<LayoutIndex> Merge(const std::vector<std::string>& blobs) {
  std::vector<std::string_view> views(blobs.begin(), blobs.end());
  return MergeRankLayoutIndexes(views);
}

TEST(LayoutMergeTest, MergeOfRankIndexesIsTheStepIndexBitForBit) {
  const auto metas = FourRanks();
  absl::StatusOr<LayoutIndex> all = BuildLayoutIndex(4, metas);
  ASSERT_TRUE(all.ok()) << all.status();
  absl::StatusOr<LayoutIndex> merged = Merge(Blobs(metas));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(SerializeLayoutIndex(*merged), SerializeLayoutIndex(*all));
  EXPECT_EQ(merged->num_pieces(), 5u + 4u + 4u);
}

TEST(LayoutMergeTest, EachRanksOwnWholeTensorIsLeftOut) {
  auto metas = FourRanks();
  // A skeleton of another size on each rank: no global tensor.
  for (uint32_t r = 0; r < 4; ++r)
    metas[r].push_back(testing::Float32Piece("skel", {r + 1}));
  absl::StatusOr<LayoutIndex> merged = Merge(Blobs(metas));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->FindTensor("skel"), -1);
  EXPECT_EQ(SerializeLayoutIndex(*merged),
            SerializeLayoutIndex(*BuildLayoutIndex(4, FourRanks())));
  // A sharded tensor declared with two global shapes is refused, named.
  metas = FourRanks();
  metas[2][0] = testing::Float32Piece("w", {2, 6}, {9, 6}, {4, 0});
  absl::StatusOr<LayoutIndex> bad = Merge(Blobs(metas));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tensor \"w\""), std::string::npos)
      << bad.status();
}

TEST(LayoutMergeTest, ABadRankIndexIsRefusedNamingIt) {
  const auto blobs = Blobs(FourRanks());
  auto refusal = [&](std::string_view blob, uint32_t rank, uint32_t world) {
    absl::StatusOr<LayoutIndex> i =
        ParseRankLayoutIndex(blob, rank, world, "reports[0].layout_index");
    EXPECT_FALSE(i.ok());
    EXPECT_EQ(i.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(i.status().message());
  };
  ASSERT_TRUE(ParseRankLayoutIndex(blobs[1], 1, 4, "f").ok());
  std::string flipped = blobs[1];
  flipped[10] ^= 1;
  EXPECT_EQ(refusal(flipped, 1, 4).rfind("reports[0].layout_index: ", 0), 0u);
  EXPECT_NE(refusal(blobs[1], 2, 4)
                .find("a piece of rank 1, in the index "
                      "of rank 2"),
            std::string::npos);
  EXPECT_NE(refusal(blobs[1], 1, 5).find("world_size 4, the step's is 5"),
            std::string::npos);
  EXPECT_NE(refusal(std::string(kMaxRankLayoutIndexBytes + 1, 'x'), 1, 4)
                .find("more than"),
            std::string::npos);
  // In a merge the rank's position names it.
  std::vector<std::string> swapped = blobs;
  std::swap(swapped[0], swapped[1]);
  absl::StatusOr<LayoutIndex> m = Merge(swapped);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().rfind("rank 0: layout_index: ", 0), 0u)
      << m.status();
}

}  // namespace
}  // namespace ckpt::storage
