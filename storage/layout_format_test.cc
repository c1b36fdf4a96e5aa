#include "storage/layout_format.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "storage/layout_testing.h"
#include "util/checksum.h"

namespace ckpt::storage {
namespace {

using testing::EvenCuts;
using testing::GridBoxes;
using testing::MakeIndex;
using testing::TestPiece;

LayoutIndex SmallIndex() {
  std::vector<TestPiece> pieces;
  const std::vector<Box> rows = GridBoxes({EvenCuts(10, 3), {0, 4}});
  for (size_t i = 0; i < rows.size(); ++i)
    pieces.push_back({"a.weight", uint32_t(i), rows[i]});
  const std::vector<Box> blocks = GridBoxes({EvenCuts(6, 2), EvenCuts(300, 2)});
  for (size_t i = 0; i < blocks.size(); ++i)
    pieces.push_back({"b", uint32_t(i % 3), blocks[i]});
  pieces.push_back({"scalar", 1, Box{}});
  return MakeIndex(3, {{"a.weight", {10, 4}}, {"b", {6, 300}}, {"scalar", {}}},
                   pieces);
}

// Replaces the trailing checksum so a test reaches the structural checks.
void Reseal(std::string* bytes) {
  const uint64_t h = Hash64(bytes->data(), bytes->size() - 8);
  for (int i = 0; i < 8; ++i)
    (*bytes)[bytes->size() - 8 + i] = static_cast<char>(h >> 8 * i);
}

void ExpectSame(const LayoutIndex& a, const LayoutIndex& b) {
  ASSERT_EQ(a.world_size(), b.world_size());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  ASSERT_EQ(a.num_pieces(), b.num_pieces());
  for (size_t t = 0; t < a.tensors().size(); ++t) {
    EXPECT_EQ(a.tensors()[t].name, b.tensors()[t].name);
    EXPECT_EQ(a.tensors()[t].split_dim, b.tensors()[t].split_dim);
    EXPECT_EQ(a.tensors()[t].global_shape, b.tensors()[t].global_shape);
  }
  for (uint64_t p = 0; p < a.num_pieces(); ++p) {
    EXPECT_EQ(a.piece_rank(p), b.piece_rank(p));
    EXPECT_EQ(a.piece_tensor(p), b.piece_tensor(p));
    EXPECT_EQ(a.piece_data_offset(p), b.piece_data_offset(p));
    EXPECT_EQ(a.PieceBox(p), b.PieceBox(p));
  }
}

TEST(LayoutFormat, RoundTripsEveryField) {
  const LayoutIndex idx = SmallIndex();
  const std::string bytes = SerializeLayoutIndex(idx);
  absl::StatusOr<LayoutIndex> back = ParseLayoutIndex(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(idx, *back);
  EXPECT_EQ(SerializeLayoutIndex(*back), bytes);
}

TEST(LayoutFormat, RefusesTruncationAtEveryByte) {
  const std::string bytes = SerializeLayoutIndex(SmallIndex());
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<LayoutIndex> r = ParseLayoutIndex(bytes.substr(0, n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  }
}

// Resealed truncations reach the body parser: each must be refused there.
TEST(LayoutFormat, RefusesResealedTruncationAtEveryBodyByte) {
  const std::string bytes = SerializeLayoutIndex(SmallIndex());
  for (size_t n = 8; n + 8 < bytes.size(); ++n) {
    std::string cut = bytes.substr(0, n) + std::string(8, '\0');
    Reseal(&cut);
    absl::StatusOr<LayoutIndex> r = ParseLayoutIndex(cut);
    ASSERT_FALSE(r.ok()) << "body cut at " << n << " parsed";
  }
}

TEST(LayoutFormat, EveryByteFlipIsRefusedByTheChecksum) {
  const std::string bytes = SerializeLayoutIndex(SmallIndex());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x01;
    EXPECT_FALSE(ParseLayoutIndex(bad).ok()) << "flip at " << i;
  }
}

// Random flips behind a valid checksum: never a crash; what parses is an
// index that writes itself back to the same bytes.
TEST(LayoutFormat, ResealedRandomFlipsNeverCrash) {
  const std::string bytes = SerializeLayoutIndex(SmallIndex());
  std::mt19937_64 rng(42);
  int refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bad = bytes;
    const int flips = 1 + rng() % 3;
    for (int f = 0; f < flips; ++f)
      bad[8 + rng() % (bad.size() - 16)] ^= 1 << (rng() % 8);
    Reseal(&bad);
    absl::StatusOr<LayoutIndex> r = ParseLayoutIndex(bad);
    if (!r.ok()) {
      ++refused;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
      continue;
    }
    EXPECT_EQ(SerializeLayoutIndex(*r), bad);
  }
  EXPECT_GT(refused, 1000);
}

TEST(LayoutFormat, RefusalsNameWhatIsWrong) {
  const LayoutIndex idx = MakeIndex(
      2, {{"w", {4}}},
      {{"w", 0, GridBoxes({{0, 2}})[0]}, {"w", 1, GridBoxes({{2, 4}})[0]}});
  const std::string good = SerializeLayoutIndex(idx);
  // Body: world_size(2) tensor_count(1) name_len(1) 'w' dtype ndim(1)
  // global_shape(4) split_dim(0) piece_count(2) then pieces (rank, data
  // offset, offset, length).
  auto with = [&](size_t at, char v, size_t at2 = 0, char v2 = 0) {
    std::string b = good;
    b[at] = v;
    if (at2 != 0) b[at2] = v2;
    Reseal(&b);
    return std::string(ParseLayoutIndex(b).status().message());
  };
  const size_t body = 8, piece0 = body + 9;
  EXPECT_EQ(with(piece0, 5),
            "layout index: tensors[0] \"w\" piece 0.rank: 5, world_size is 2");
  EXPECT_EQ(with(piece0 + 3, 0),
            "layout index: tensors[0] \"w\" piece 0.lengths[0]: is 0");
  EXPECT_EQ(
      with(piece0 + 2, 3),
      "layout index: tensors[0] \"w\" piece 0.offsets[0]: 3 + length 2 exceed "
      "global_shape[0] 4");
  EXPECT_EQ(
      with(piece0 + 2, 2, piece0 + 4 + 2, 1),
      "layout index: tensors[0] \"w\" piece 1.offsets: not in index order");
  EXPECT_EQ(with(body + 4, 77),
            "layout index: tensors[0] \"w\".dtype: 77 is not a dtype");
  EXPECT_EQ(
      with(body + 8, 9),
      "layout index: tensors[0] \"w\".piece_count: 9, more than the bytes left "
      "hold");
  EXPECT_EQ(with(body + 3, '\n'),
            "layout index: tensors[0].name: non-printable character 0x0a");
  // Scalar replicas must come by rank: the planner binary-searches them.
  const std::string scalars = SerializeLayoutIndex(
      MakeIndex(2, {{"s", {}}}, {{"s", 0, Box{}}, {"s", 1, Box{}}}));
  std::string swapped = scalars;
  swapped[body + 8] = 1;
  swapped[body + 10] = 0;
  Reseal(&swapped);
  EXPECT_EQ(
      std::string(ParseLayoutIndex(swapped).status().message()),
      "layout index: tensors[0] \"s\" piece 1.offsets: not in index order");
  std::string b = good;
  b[4] = 2;
  EXPECT_EQ(std::string(ParseLayoutIndex(b).status().message()),
            "layout index: version: 2, this build reads 1");
}

}  // namespace
}  // namespace ckpt::storage
