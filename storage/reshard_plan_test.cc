#include "storage/reshard_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>

#include "storage/layout_testing.h"

namespace ckpt::storage {
namespace {

using testing::EvenCuts;
using testing::ExecuteAndCheck;
using testing::Flatten;
using testing::GridBoxes;
using testing::MakeIndex;
using testing::TestPiece;
using testing::TestTensor;

std::vector<TestPiece> Assign(const std::string& tensor,
                              const std::vector<Box>& boxes) {
  std::vector<TestPiece> out;
  for (size_t i = 0; i < boxes.size(); ++i)
    out.push_back({tensor, uint32_t(i), boxes[i]});
  return out;
}

std::vector<PlannedRead> PlanOk(const LayoutIndex& saved,
                                const LayoutIndex& requested,
                                const PlanOptions& options = {}) {
  absl::StatusOr<std::vector<std::vector<PlannedRead>>> plan =
      PlanReshardByRank(saved, requested, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  for (uint32_t r = 0; r < plan->size(); ++r)
    for (const PlannedRead& read : (*plan)[r])
      EXPECT_EQ(requested.piece_rank(read.request), r);
  return Flatten(*plan);
}

// Row-sharded and 2-D block-sharded tensors, 8 ranks to `to` ranks.
void Reshard(uint32_t to, std::vector<uint64_t> new_grid) {
  const std::vector<TestTensor> tensors = {{"rows", {101, 7}},
                                           {"blocks", {24, 36}}};
  std::vector<TestPiece> saved =
      Assign("rows", GridBoxes({EvenCuts(101, 8), {0, 7}}));
  std::vector<TestPiece> b =
      Assign("blocks", GridBoxes({EvenCuts(24, 2), EvenCuts(36, 4)}));
  saved.insert(saved.end(), b.begin(), b.end());
  std::vector<TestPiece> want =
      Assign("rows", GridBoxes({EvenCuts(101, to), {0, 7}}));
  b = Assign("blocks",
             GridBoxes({EvenCuts(24, new_grid[0]), EvenCuts(36, new_grid[1])}));
  want.insert(want.end(), b.begin(), b.end());
  const LayoutIndex s = MakeIndex(8, tensors, saved),
                    r = MakeIndex(to, tensors, want);
  const std::vector<PlannedRead> reads = PlanOk(s, r);
  ExecuteAndCheck(s, r, reads);
}

TEST(ReshardPlan, EightToSix) { Reshard(6, {3, 2}); }
TEST(ReshardPlan, EightToFour) { Reshard(4, {2, 2}); }
TEST(ReshardPlan, EightToTwelve) { Reshard(12, {3, 4}); }

TEST(ReshardPlan, TensorRangesTogetherGiveTheWholePlan) {
  const std::vector<TestTensor> t = {{"a", {16}}, {"b", {12}}, {"c", {9}}};
  std::vector<TestPiece> saved, want;
  for (const TestTensor& x : t) {
    for (TestPiece p : Assign(x.name, GridBoxes({EvenCuts(x.shape[0], 4)})))
      saved.push_back(p);
    for (TestPiece p : Assign(x.name, GridBoxes({EvenCuts(x.shape[0], 3)})))
      want.push_back(p);
  }
  const LayoutIndex s = MakeIndex(4, t, saved), r = MakeIndex(3, t, want);
  std::vector<std::string> whole, parts;
  auto into = [](std::vector<std::string>* out) {
    return [out](const PlannedRead& x) {
      out->push_back(std::to_string(x.saved_piece) + "/" +
                     std::to_string(x.request) + " " + x.box.ToString());
    };
  };
  ASSERT_TRUE(PlanReshard(s, r, {}, into(&whole)).ok());
  ASSERT_TRUE(PlanReshardTensors(s, r, {}, 0, 1, into(&parts)).ok());
  ASSERT_TRUE(PlanReshardTensors(s, r, {}, 1, 3, into(&parts)).ok());
  EXPECT_EQ(parts, whole);
  EXPECT_FALSE(whole.empty());
}

TEST(ReshardPlan, RowShardedReadsAreSingleContiguousRuns) {
  const std::vector<TestTensor> t = {{"w", {16, 5}}};
  const LayoutIndex s =
      MakeIndex(4, t, Assign("w", GridBoxes({EvenCuts(16, 4), {0, 5}})));
  const LayoutIndex r =
      MakeIndex(3, t, Assign("w", GridBoxes({{0, 6, 11, 16}, {0, 5}})));
  const std::vector<PlannedRead> reads = PlanOk(s, r);
  // New rank 0 rows [0, 6): old pieces [0, 4) and [4, 8) rows 4-5.
  ASSERT_EQ(reads.size(), 6u);
  EXPECT_EQ(reads[1].box.ToString(), "offsets [4, 0] lengths [2, 5]");
  int runs = 0;
  ForEachByteRun(s, r, reads[1], [&](uint64_t so, uint64_t dof, uint64_t n) {
    ++runs;
    EXPECT_EQ(so, 0u);
    EXPECT_EQ(dof, 4u * 5 * 4);
    EXPECT_EQ(n, 2u * 5 * 4);
  });
  EXPECT_EQ(runs, 1);
  ExecuteAndCheck(s, r, reads);
}

TEST(ReshardPlan, ReplicatedTensorIsReadFromTheAskingRanksOwnCopy) {
  const std::vector<TestTensor> t = {{"bias", {9}}};
  std::vector<TestPiece> saved;
  for (uint32_t r = 0; r < 8; ++r)
    saved.push_back({"bias", r, GridBoxes({{0, 9}})[0]});
  const LayoutIndex s = MakeIndex(8, t, saved);
  std::vector<TestPiece> want;
  for (uint32_t r = 0; r < 12; ++r)
    want.push_back({"bias", r, GridBoxes({{0, 9}})[0]});
  const LayoutIndex r = MakeIndex(12, t, want);
  const std::vector<PlannedRead> reads = PlanOk(s, r);
  ASSERT_EQ(reads.size(), 12u);
  for (const PlannedRead& read : reads) {
    const uint32_t asker = r.piece_rank(read.request);
    EXPECT_EQ(s.piece_rank(read.saved_piece), asker < 8 ? asker : 0u);
  }
  // With nodes of 4 ranks, new ranks 8-11 sit on node 1 and prefer a copy
  // there (old rank 4 first) over old rank 0.
  const std::vector<uint32_t> saved_node = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<uint32_t> new_node = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<PlannedRead> near = PlanOk(s, r, {saved_node, new_node});
  for (const PlannedRead& read : near) {
    const uint32_t asker = r.piece_rank(read.request);
    if (asker >= 8) {
      EXPECT_EQ(s.piece_rank(read.saved_piece), 4u);
    }
  }
  ExecuteAndCheck(s, r, reads);
}

TEST(ReshardPlan, OverlappingSavedPiecesGiveEachByteOnce) {
  const std::vector<TestTensor> t = {{"w", {12, 6}}};
  // Rows [0, 7) on rank 0, [4, 12) on rank 1, and a block [2, 10) x [1, 5)
  // on rank 2: rows 4-6 and the block overlap.
  Box a = GridBoxes({{0, 7}, {0, 6}})[0], b = GridBoxes({{4, 12}, {0, 6}})[0],
      c = GridBoxes({{2, 10}, {1, 5}})[0];
  const LayoutIndex s =
      MakeIndex(3, t, {{"w", 0, a}, {"w", 1, b}, {"w", 2, c}});
  const LayoutIndex r = MakeIndex(
      5, t, Assign("w", GridBoxes({EvenCuts(12, 5), EvenCuts(6, 1)})));
  ExecuteAndCheck(s, r, PlanOk(s, r));
  // Rank 2 asking for the whole tensor reads its own block first.
  const LayoutIndex whole =
      MakeIndex(3, t, {{"w", 2, GridBoxes({{0, 12}, {0, 6}})[0]}});
  const std::vector<PlannedRead> reads = PlanOk(s, whole);
  ASSERT_FALSE(reads.empty());
  EXPECT_EQ(s.piece_rank(reads[0].saved_piece), 2u);
  EXPECT_EQ(reads[0].box, c);
  ExecuteAndCheck(s, whole, reads);
}

TEST(ReshardPlan, GapIsAnErrorNamingTensorAndRegion) {
  const std::vector<TestTensor> t = {{"w", {12, 6}}};
  const LayoutIndex s = MakeIndex(2, t,
                                  {{"w", 0, GridBoxes({{0, 5}, {0, 6}})[0]},
                                   {"w", 1, GridBoxes({{7, 12}, {0, 6}})[0]}});
  const LayoutIndex r =
      MakeIndex(2, t, Assign("w", GridBoxes({EvenCuts(12, 2), {0, 6}})));
  absl::Status st = PlanReshard(s, r, {}, [](const PlannedRead&) {});
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "tensor \"w\": region offsets [5, 0] lengths [1, 6] asked by rank "
            "0 is in "
            "no saved piece");
}

TEST(ReshardPlan, RefusesUnknownTensorOtherShapeAndNodeTables) {
  const LayoutIndex s =
      MakeIndex(1, {{"w", {4}}}, {{"w", 0, GridBoxes({{0, 4}})[0]}});
  const LayoutIndex other =
      MakeIndex(1, {{"w", {5}}}, {{"w", 0, GridBoxes({{0, 5}})[0]}});
  const LayoutIndex missing =
      MakeIndex(1, {{"x", {4}}}, {{"x", 0, GridBoxes({{0, 4}})[0]}});
  auto none = [](const PlannedRead&) {};
  EXPECT_EQ(PlanReshard(s, other, {}, none).message(),
            "tensor \"w\": requested as int32 [5], saved as int32 [4]");
  EXPECT_EQ(PlanReshard(s, missing, {}, none).message(),
            "tensor \"x\": not in the saved index");
  // Declared, but no rank saved a piece of it.
  const LayoutIndex empty = MakeIndex(1, {{"w", {4}}}, {});
  EXPECT_EQ(
      PlanReshard(empty, s, {}, none).message(),
      "tensor \"w\": region offsets [0] lengths [4] asked by rank 0 is in no "
      "saved piece");
  const std::vector<uint32_t> two = {0, 1}, one = {0};
  EXPECT_EQ(PlanReshard(s, s, {two, one}, none).message(),
            "saved_node: 2 entries, saved world_size 1");
}

TEST(ReshardPlan, ScalarsAndBlockRunsAcrossThreeDims) {
  const std::vector<TestTensor> t = {{"s", {}}, {"cube", {4, 6, 8}}};
  std::vector<TestPiece> saved = {{"s", 1, Box{}}};
  for (TestPiece p :
       Assign("cube", GridBoxes({EvenCuts(4, 2), EvenCuts(6, 3), {0, 8}}))) {
    p.rank %= 2;
    saved.push_back(p);
  }
  std::vector<TestPiece> want = {{"s", 0, Box{}}};
  for (TestPiece p :
       Assign("cube", GridBoxes({{0, 4}, EvenCuts(6, 2), EvenCuts(8, 2)}))) {
    p.rank %= 2;
    want.push_back(p);
  }
  const LayoutIndex s = MakeIndex(2, t, saved), r = MakeIndex(2, t, want);
  ExecuteAndCheck(s, r, PlanOk(s, r));
}

// A reference that compares every saved piece with every request: on
// layouts without overlap the reads are the pairwise intersections.
std::vector<std::tuple<uint64_t, uint64_t, std::string>> BruteForce(
    const LayoutIndex& s, const LayoutIndex& r) {
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> out;
  for (uint64_t q = 0; q < r.num_pieces(); ++q) {
    const LayoutTensor& rt = r.tensors()[r.piece_tensor(q)];
    for (uint64_t p = 0; p < s.num_pieces(); ++p) {
      if (s.tensors()[s.piece_tensor(p)].name != rt.name) continue;
      const Box a = s.PieceBox(p), b = r.PieceBox(q);
      Box cut;
      cut.ndim = a.ndim;
      bool hit = true;
      for (uint32_t d = 0; d < a.ndim; ++d) {
        const uint64_t lo = std::max(a.offsets[d], b.offsets[d]);
        const uint64_t hi =
            std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
        if (lo >= hi) hit = false;
        cut.offsets[d] = lo;
        cut.lengths[d] = hi > lo ? hi - lo : 0;
      }
      if (hit) out.emplace_back(p, q, cut.ToString());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint64_t> RandomCuts(std::mt19937_64& rng, uint64_t n) {
  std::vector<uint64_t> c = {0, n};
  const int extra = rng() % 5;
  for (int i = 0; i < extra; ++i) c.push_back(rng() % (n + 1));
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

TEST(ReshardPlan, MatchesBruteForceOnRandomLayouts) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    const uint32_t ndim = 1 + rng() % 3;
    std::vector<uint64_t> shape;
    for (uint32_t d = 0; d < ndim; ++d) shape.push_back(1 + rng() % 9);
    const std::vector<TestTensor> t = {{"w", shape}};
    std::vector<std::vector<uint64_t>> sc, rc;
    for (uint64_t n : shape) {
      sc.push_back(RandomCuts(rng, n));
      rc.push_back(RandomCuts(rng, n));
    }
    const uint32_t sw = 1 + rng() % 6, rw = 1 + rng() % 6;
    std::vector<TestPiece> saved, want;
    for (const Box& b : GridBoxes(sc))
      saved.push_back({"w", uint32_t(rng() % sw), b});
    for (const Box& b : GridBoxes(rc))
      want.push_back({"w", uint32_t(rng() % rw), b});
    const LayoutIndex s = MakeIndex(sw, t, saved), r = MakeIndex(rw, t, want);
    std::vector<std::tuple<uint64_t, uint64_t, std::string>> got;
    const std::vector<PlannedRead> reads = PlanOk(s, r);
    for (const PlannedRead& x : reads)
      got.emplace_back(x.saved_piece, x.request, x.box.ToString());
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, BruteForce(s, r)) << "seed " << seed;
    ExecuteAndCheck(s, r, reads);
    // Replicas of the whole layout on other ranks: still each byte once.
    std::vector<TestPiece> twice = saved;
    for (TestPiece p : saved) {
      p.rank = (p.rank + 1) % sw;
      twice.push_back(p);
    }
    const LayoutIndex s2 = MakeIndex(sw, t, twice);
    ExecuteAndCheck(s2, r, PlanOk(s2, r));
  }
}

}  // namespace
}  // namespace ckpt::storage
