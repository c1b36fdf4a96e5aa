#include "storage/layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "storage/layout_testing.h"

namespace ckpt::storage {
namespace {

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string Refusal(const v1::TensorMeta& m) {
  absl::Status s = ValidateTensorLayout(m, "tensors[2]");
  EXPECT_FALSE(s.ok());
  return std::string(s.message());
}

TEST(TensorLayout, WholeAndPieceMetasPass) {
  EXPECT_TRUE(
      ValidateTensorLayout(testing::Float32Piece("w", {4, 8}), "t").ok());
  EXPECT_TRUE(ValidateTensorLayout(
                  testing::Float32Piece("w", {2, 8}, {4, 8}, {2, 0}), "t")
                  .ok());
  EXPECT_TRUE(ValidateTensorLayout(testing::Float32Piece("s", {}), "t").ok());
}

TEST(TensorLayout, EveryRefusalNamesItsField) {
  v1::TensorMeta m = testing::Float32Piece("w", {2, 8}, {4, 8}, {3, 0});
  EXPECT_PRED2(Contains, Refusal(m),
               "tensors[2].piece_offsets[0]: offset 3 + "
               "length 2 exceed global_shape[0] 4");
  m = testing::Float32Piece("w", {2, 8}, {4, 8}, {0, 0});
  m.set_bytes(60);
  EXPECT_PRED2(Contains, Refusal(m),
               "tensors[2].bytes: 60, but shape x dtype "
               "size is 64");
  EXPECT_PRED2(Contains,
               Refusal(testing::Float32Piece("w", {2, 8}, {4}, {0, 0})),
               "tensors[2].global_shape: 1 dims, shape has 2");
  EXPECT_PRED2(Contains,
               Refusal(testing::Float32Piece("w", {2, 8}, {4, 8}, {0})),
               "tensors[2].piece_offsets: 1 dims, shape has 2");
  EXPECT_PRED2(Contains,
               Refusal(testing::Float32Piece("w", {2, 8}, {}, {0, 0})),
               "tensors[2].piece_offsets: set without global_shape");
  m = testing::Float32Piece("w", {2, 8});
  m.set_global_name("g");
  EXPECT_PRED2(Contains, Refusal(m),
               "tensors[2].global_name: set without global_shape");
  m = testing::Float32Piece("w", {2, 8}, {4, 8}, {0, 0});
  m.set_global_name(std::string("bad\n", 4));
  EXPECT_PRED2(Contains, Refusal(m), "tensors[2].global_name");
  m = testing::Float32Piece("w", {2});
  m.set_dtype(99);
  EXPECT_PRED2(Contains, Refusal(m), "tensors[2].dtype: 99");
  m = testing::Float32Piece("w", {1ull << 62, 8});
  EXPECT_PRED2(Contains, Refusal(m), "tensors[2].shape: bytes overflow");
}

// A TensorMeta as a shard written before the layout fields encodes it: name
// "w", float32, shape [2, 3], offset 4096, 24 bytes.
TEST(TensorLayout, OldMetaWithoutLayoutFieldsReadsAsWholeTensor) {
  const std::string old_wire(
      "\x0a\x01w\x10\x01\x1a\x02\x02\x03\x20\x80\x20\x28\x18", 14);
  v1::TensorMeta m;
  ASSERT_TRUE(m.ParseFromString(old_wire));
  EXPECT_EQ(m.global_shape_size(), 0);
  ASSERT_TRUE(ValidateTensorLayout(m, "t").ok());
  std::vector<std::vector<v1::TensorMeta>> shards = {{m}, {m}};
  absl::StatusOr<LayoutIndex> idx = BuildLayoutIndex(2, shards);
  ASSERT_TRUE(idx.ok()) << idx.status();
  ASSERT_EQ(idx->tensors().size(), 1u);
  EXPECT_EQ(idx->tensors()[0].global_shape[0], 2u);
  EXPECT_EQ(idx->tensors()[0].global_shape[1], 3u);
  ASSERT_EQ(idx->num_pieces(), 2u);  // two whole replicas
  EXPECT_EQ(idx->PieceBox(1).ToString(), "offsets [0, 0] lengths [2, 3]");
  EXPECT_EQ(idx->piece_data_offset(0), 4096u);
  // The new fields survive the wire, and an old reader's fields are intact.
  v1::TensorMeta n = testing::Float32Piece("w", {1, 3}, {2, 3}, {1, 0});
  v1::TensorMeta back;
  ASSERT_TRUE(back.ParseFromString(n.SerializeAsString()));
  EXPECT_EQ(back.piece_offsets(0), 1u);
  EXPECT_EQ(back.global_shape(0), 2u);
}

TEST(LayoutIndexBuild, RefusesInconsistentRanks) {
  std::vector<std::vector<v1::TensorMeta>> shards = {
      {testing::Float32Piece("w", {2, 8})}};
  EXPECT_PRED2(Contains,
               std::string(BuildLayoutIndex(2, shards).status().message()),
               "shards: 1 rank lists, world_size 2");
  shards = {{testing::Float32Piece("w", {2, 8}, {4, 8}, {0, 0})},
            {testing::Float32Piece("w", {2, 8}, {4, 9}, {2, 0})}};
  EXPECT_PRED2(Contains,
               std::string(BuildLayoutIndex(2, shards).status().message()),
               "shards[1].tensors[0]: tensor \"w\"");
  shards = {{testing::Float32Piece("w", {2, 8}, {4, 8}, {0, 0})},
            {testing::Float32Piece("w", {2, 8}, {4, 8}, {3, 0})}};
  EXPECT_PRED2(Contains,
               std::string(BuildLayoutIndex(2, shards).status().message()),
               "shards[1].tensors[0].piece_offsets[0]");
}

TEST(LayoutIndexBuild, GroupsPiecesByTensorSortedAlongSplitDim) {
  // Rank 0 holds two pieces of "w" under two local names; rank 1 one; the
  // split dimension is 1, where the offsets differ.
  v1::TensorMeta a = testing::Float32Piece("w.a", {4, 2}, {4, 6}, {0, 4});
  a.set_global_name("w");
  v1::TensorMeta b = testing::Float32Piece("w.b", {4, 2}, {4, 6}, {0, 0});
  b.set_global_name("w");
  v1::TensorMeta empty = testing::Float32Piece("e", {0, 3});
  std::vector<std::vector<v1::TensorMeta>> shards = {
      {a, b, empty}, {testing::Float32Piece("w", {4, 2}, {4, 6}, {0, 2})}};
  absl::StatusOr<LayoutIndex> idx = BuildLayoutIndex(2, shards);
  ASSERT_TRUE(idx.ok()) << idx.status();
  ASSERT_EQ(idx->tensors().size(), 2u);
  EXPECT_EQ(idx->tensors()[0].name, "e");
  EXPECT_EQ(idx->tensors()[0].num_pieces, 0u);
  const LayoutTensor& w = idx->tensors()[1];
  EXPECT_EQ(w.name, "w");
  EXPECT_EQ(w.split_dim, 1u);
  ASSERT_EQ(w.num_pieces, 3u);
  EXPECT_EQ(idx->piece_offset(w.first_piece + 0, 1), 0u);
  EXPECT_EQ(idx->piece_offset(w.first_piece + 1, 1), 2u);
  EXPECT_EQ(idx->piece_rank(w.first_piece + 1), 1u);
  EXPECT_EQ(idx->piece_offset(w.first_piece + 2, 1), 4u);
  EXPECT_EQ(idx->FindTensor("w"), 1);
  EXPECT_EQ(idx->FindTensor("x"), -1);
}

TEST(LayoutIndexBuild, BuilderRefusesBadPieces) {
  LayoutIndexBuilder b(4);
  const uint64_t shape[] = {8, 8};
  absl::StatusOr<uint32_t> t = b.AddTensor("w", DType::kFloat32, shape);
  ASSERT_TRUE(t.ok());
  const uint64_t off[] = {0, 0}, len[] = {8, 8}, zero[] = {8, 0};
  EXPECT_PRED2(Contains,
               std::string(b.AddPiece(*t, 4, 0, off, len, "p").message()),
               "p: rank 4, must be below world_size 4");
  EXPECT_PRED2(Contains,
               std::string(b.AddPiece(*t, 0, 0, off, zero, "p").message()),
               "p: lengths[1] is 0");
  EXPECT_PRED2(Contains,
               std::string(b.AddPiece(9, 0, 0, off, len, "p").message()),
               "p: tensor id 9");
  const uint64_t other[] = {8, 9};
  EXPECT_FALSE(b.AddTensor("w", DType::kFloat32, other).ok());
  EXPECT_EQ(*b.AddTensor("w", DType::kFloat32, shape), *t);
}

}  // namespace
}  // namespace ckpt::storage
