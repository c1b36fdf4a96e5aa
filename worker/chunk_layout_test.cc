#include "worker/chunk_layout.h"

#include <gtest/gtest.h>

namespace ckpt::worker {
namespace {

std::vector<TensorSpec> Tensors(std::initializer_list<size_t> sizes) {
  std::vector<TensorSpec> out;
  for (size_t n : sizes) out.push_back({"t" + std::to_string(out.size()), n});
  return out;
}

TEST(ChunkLayoutTest, NextFitOpensANewChunkWhenATensorDoesNotFit) {
  absl::StatusOr<ChunkLayout> layout =
      NextFitLayout(Tensors({6, 3, 2, 5, 4}), 10);
  ASSERT_TRUE(layout.ok()) << layout.status();
  // Next-Fit never goes back: the 2 does not fit after 6 + 3, nor the 4 after 2
  // + 5.
  ASSERT_EQ(layout->num_chunks(), 3u);
  EXPECT_EQ(layout->chunk_used, (std::vector<size_t>{9, 7, 4}));
  EXPECT_EQ(layout->slots[1].chunk, 0u);
  EXPECT_EQ(layout->slots[1].offset, 6u);
  EXPECT_EQ(layout->slots[3].chunk, 1u);
  EXPECT_EQ(layout->slots[3].offset, 2u);
  EXPECT_EQ(layout->waste_elems, 30u - 20u);
}

TEST(ChunkLayoutTest, SearchPicksLeastWasteNotSmallestSize) {
  // Chunk 6 wastes 1 per tensor (4 chunks, waste 4); chunk 10 holds two
  // tensors each and wastes nothing. A search whose waste counter carries over
  // between candidates would keep the first (smallest) size.
  absl::StatusOr<ChunkLayout> layout =
      SearchChunkSize(Tensors({5, 5, 5, 5}), {6, 12, 1});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->chunk_elems, 10u);
  EXPECT_EQ(layout->waste_elems, 0u);
  EXPECT_EQ(layout->num_chunks(), 2u);
}

TEST(ChunkLayoutTest, SearchBreaksTiesTowardTheSmallerSize) {
  // 8 and 16 both waste nothing; 12 wastes 4.
  absl::StatusOr<ChunkLayout> layout =
      SearchChunkSize(Tensors({4, 4, 4, 4}), {8, 16, 4});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->chunk_elems, 8u);
}

TEST(ChunkLayoutTest, SearchSkipsCandidatesSmallerThanTheLargestTensor) {
  absl::StatusOr<ChunkLayout> layout =
      SearchChunkSize(Tensors({3, 9, 3}), {4, 20, 4});
  ASSERT_TRUE(layout.ok()) << layout.status();
  // 4 and 8 cannot hold the 9; 12 wastes 9 ([3, 9] [3]), 16 wastes 1, 20
  // wastes 5.
  EXPECT_EQ(layout->chunk_elems, 16u);
  EXPECT_EQ(layout->waste_elems, 1u);
}

TEST(ChunkLayoutTest, ChunkSmallerThanLargestTensorIsRefusedByName) {
  std::vector<TensorSpec> tensors = {
      {"embed", 100}, {"head.weight", 300}, {"bias", 10}};
  absl::StatusOr<ChunkLayout> layout = NextFitLayout(tensors, 200);
  ASSERT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(layout.status().message()).find("head.weight"),
            std::string::npos);
  absl::StatusOr<ChunkLayout> searched =
      SearchChunkSize(tensors, {100, 250, 50});
  ASSERT_EQ(searched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(searched.status().message()).find("head.weight"),
            std::string::npos);
}

TEST(ChunkLayoutTest, MalformedInputsAreRefused) {
  EXPECT_FALSE(NextFitLayout({}, 10).ok());
  EXPECT_FALSE(NextFitLayout(Tensors({3, 0}), 10).ok());
  EXPECT_FALSE(NextFitLayout(std::vector<TensorSpec>{{"", 3}}, 10).ok());
  EXPECT_FALSE(SearchChunkSize(Tensors({3}), {10, 5, 1}).ok());
  EXPECT_FALSE(SearchChunkSize(Tensors({3}), {4, 8, 0}).ok());
}

}  // namespace
}  // namespace ckpt::worker
