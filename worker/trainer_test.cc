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
