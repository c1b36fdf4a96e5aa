#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <numeric>

namespace ckpt::worker {
namespace {

TrainerOptions Small(int64_t steps) {
  TrainerOptions o;
  o.model = MlpConfig{/*vocab=*/64, /*dim=*/32, /*layers=*/2, /*seq=*/16,
                      /*batch=*/8};
  o.steps = steps;
  o.seed = 11;
  o.lr = 1e-2f;
  o.log_every = 0;
  return o;
}

float Mean(const std::vector<float>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, 0.0f) /
         float(end - begin);
}

TEST(TrainerTest, LossFallsOnTheSyntheticTask) {
  auto t = Trainer::Create(Small(120), nullptr);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE((*t)->Run(nullptr).ok());
  const std::vector<float>& loss = (*t)->losses();
  ASSERT_EQ(loss.size(), 120u);
  float first = Mean(loss, 0, 10), last = Mean(loss, 110, 120);
  // Uniform guessing costs ln(64) = 4.16; four patterns leave about ln(4).
  EXPECT_GT(loss[0], 3.5f);
  EXPECT_LT(last, 0.7f * first) << "first " << first << " last " << last;
}

TEST(TrainerTest, RerunGivesTheSameDigestAndOffloadDoesNotChangeIt) {
  auto digest = [](double offload) {
    TrainerOptions o = Small(15);
    o.offload_fraction = offload;
    auto t = Trainer::Create(o, nullptr);
    EXPECT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE((*t)->Run(nullptr).ok());
    return *(*t)->ParamsDigest();
  };
  uint64_t half = digest(0.5);
  EXPECT_EQ(half, digest(0.5));
  // Device Adam and CPU Adam agree bit for bit, so placement is invisible.
  EXPECT_EQ(half, digest(0.0));
  EXPECT_EQ(half, digest(1.0));
}

// ZeRO-1's partition: every flattened element in exactly one rank's
// slice, the slices within one element of each other, each cut into
// pieces that stay inside their tensor.
TEST(TrainerTest, Zero1SlicesCoverEveryElementOnceInTensorPieces) {
  std::vector<size_t> numels;
  size_t total = 0;
  for (const ParamShape& p : MlpParamShapes(Small(1).model)) {
    numels.push_back(p.numel);
    total += p.numel;
  }
  for (int world : {1, 2, 3, 4, 6, 7, 64}) {
    std::vector<size_t> bounds = Zero1Bounds(total, world);
    ASSERT_EQ(bounds.size(), static_cast<size_t>(world) + 1);
    EXPECT_EQ(bounds.front(), 0u);
    EXPECT_EQ(bounds.back(), total);
    std::vector<int> owners(total, 0);
    for (int r = 0; r < world; ++r) {
      const size_t n = bounds[r + 1] - bounds[r];
      EXPECT_LE(n, total / world + 1) << "world " << world << " rank " << r;
      EXPECT_GE(n, total / world) << "world " << world << " rank " << r;
      size_t at = bounds[r];
      for (const StatePiece& p : PiecesOf(numels, bounds[r], bounds[r + 1])) {
        ASSERT_LT(p.tensor, numels.size());
        ASSERT_GT(p.numel, 0u);
        ASSERT_LE(p.offset + p.numel, numels[p.tensor]);
        size_t start = 0;
        for (size_t i = 0; i < p.tensor; ++i) start += numels[i];
        EXPECT_EQ(start + p.offset, at) << "pieces in flattened order";
        for (size_t e = 0; e < p.numel; ++e) ++owners[at + e];
        at += p.numel;
      }
      EXPECT_EQ(at, bounds[r + 1]);
    }
    for (size_t e = 0; e < total; ++e)
      ASSERT_EQ(owners[e], 1) << "world " << world << " element " << e;
  }
}

// One rank holding the whole slice computes what plain training does;
// more ranks than parameters are refused naming world_size.
TEST(TrainerTest, Zero1AloneMatchesPlainAndRefusesTooManyRanks) {
  TrainerOptions o = Small(12);
  auto plain = Trainer::Create(o, nullptr);
  o.zero1 = true;
  auto zero1 = Trainer::Create(o, nullptr);
  ASSERT_TRUE(plain.ok() && zero1.ok()) << zero1.status();
  ASSERT_TRUE((*plain)->Run(nullptr).ok());
  ASSERT_TRUE((*zero1)->Run(nullptr).ok());
  EXPECT_EQ(*(*plain)->ParamsDigest(), *(*zero1)->ParamsDigest());
  EXPECT_EQ((*plain)->losses(), (*zero1)->losses());

  TrainerOptions tiny = Small(1);
  tiny.model = MlpConfig{/*vocab=*/2, /*dim=*/1, /*layers=*/1, /*seq=*/1,
                         /*batch=*/64};
  tiny.zero1 = true;
  tiny.world_size = 64;
  absl::Status s = ValidateTrainerOptions(tiny);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.ToString().find("world_size = 64"), std::string::npos) << s;
}

TEST(TrainerTest, DifferentSeedsGiveDifferentWeights) {
  TrainerOptions a = Small(3), b = Small(3);
  b.seed = 12;
  auto ta = Trainer::Create(a, nullptr), tb = Trainer::Create(b, nullptr);
  ASSERT_TRUE(ta.ok() && tb.ok());
  ASSERT_TRUE((*ta)->Run(nullptr).ok());
  ASSERT_TRUE((*tb)->Run(nullptr).ok());
  EXPECT_NE(*(*ta)->ParamsDigest(), *(*tb)->ParamsDigest());
}

void ExpectInvalid(const TrainerOptions& o, const std::string& field) {
  auto t = Trainer::Create(o, nullptr);
  ASSERT_FALSE(t.ok()) << field;
  EXPECT_NE(std::string(t.status().message()).find(field), std::string::npos)
      << t.status();
}

TEST(TrainerTest, RefusesOffloadFractionOutsideZeroToOne) {
  TrainerOptions o = Small(1);
  o.offload_fraction = 1.5;
  ExpectInvalid(o, "offload_fraction");
  o.offload_fraction = -0.1;
  ExpectInvalid(o, "offload_fraction");
}

TEST(TrainerTest, RefusesBadSizesAndRanks) {
  TrainerOptions o = Small(1);
  o.model.layers = -1;
  ExpectInvalid(o, "layers");
  o = Small(1);
  o.ckpt_every = -2;
  ExpectInvalid(o, "ckpt_every");
  o = Small(1);
  o.rank = 1;
  ExpectInvalid(o, "rank");
  o = Small(1);
  o.world_size = 3;
  o.rank = 1;
  ExpectInvalid(o, "batch");  // the global batch does not split over 3 ranks
  // A data-parallel rank without its connection to the other ranks.
  o.world_size = 2;
  auto t = Trainer::Create(o, nullptr);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      std::string(t.status().message()).find("needs a DataParallel connection"),
      std::string::npos)
      << t.status();
}

TEST(TrainerTest, RestoreStepWithoutDaemonIsRefused) {
  auto t = Trainer::Create(Small(1), nullptr);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Restore(5).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*(*t)->Restore(std::nullopt), 0);
}

}  // namespace
}  // namespace ckpt::worker
