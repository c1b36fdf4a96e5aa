#include "worker/mlp_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "worker/synthetic_data.h"

namespace ckpt::worker {
namespace {

MlpConfig Tiny() {
  return MlpConfig{/*vocab=*/16, /*dim=*/8, /*layers=*/2, /*seq=*/6,
                   /*batch=*/3};
}

std::vector<int32_t> Batch(const MlpConfig& c, int64_t step) {
  return MakeBatch(SyntheticData{c.vocab, c.seq, c.batch, /*seed=*/7}, step, 0);
}

void Load(MlpModel& m, const std::vector<std::vector<float>>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    std::copy(params[i].begin(), params[i].end(), m.weights(i).begin());
  }
}

TEST(MlpModelTest, GradientsMatchCentralDifferences) {
  MlpConfig c = Tiny();
  auto model = MlpModel::Create(c);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::vector<float>> params = MlpInitialParams(c, 3);
  // Non-zero biases so their gradients pass through the GELU's curvature.
  for (size_t i = 2; i + 2 < params.size(); i += 2)
    for (size_t j = 0; j < params[i].size(); ++j)
      params[i][j] = 0.1f * float(j % 3) - 0.1f;
  Load(*model, params);
  std::vector<int32_t> tokens = Batch(c, 1);
  ASSERT_TRUE(model->ForwardBackward(tokens).ok());
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    grads.emplace_back(model->gradients(i).begin(), model->gradients(i).end());
  }
  const float eps = 1e-2f;
  int checked = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < params[i].size(); j += 1 + params[i].size() / 5) {
      float saved = model->weights(i)[j];
      model->weights(i)[j] = saved + eps;
      float up = *model->ForwardBackward(tokens);
      model->weights(i)[j] = saved - eps;
      float down = *model->ForwardBackward(tokens);
      model->weights(i)[j] = saved;
      float numeric = (up - down) / (2 * eps);
      EXPECT_NEAR(grads[i][j], numeric, 2e-3f + 0.05f * std::fabs(numeric))
          << "tensor " << MlpParamShapes(c)[i].name << " element " << j;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(MlpModelTest, RefusesTokensOutsideTheVocabulary) {
  MlpConfig c = Tiny();
  auto model = MlpModel::Create(c);
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> tokens = Batch(c, 1);
  tokens[5] = c.vocab;
  absl::StatusOr<float> loss = model->ForwardBackward(tokens);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(loss.status().message()).find("tokens[5]"),
            std::string::npos);
  tokens.pop_back();
  EXPECT_FALSE(model->ForwardBackward(tokens).ok());
}

TEST(MlpModelTest, RefusesBadSizesNamingTheField) {
  MlpConfig c = Tiny();
  c.dim = 0;
  absl::Status s = ValidateMlpConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("dim"), std::string::npos);
  c = Tiny();
  c.vocab = 1;
  EXPECT_NE(std::string(ValidateMlpConfig(c).message()).find("vocab"),
            std::string::npos);
}

TEST(SyntheticDataTest, BatchIsAFunctionOfSeedStepAndRank) {
  SyntheticData d{32, 10, 4, 5};
  EXPECT_EQ(MakeBatch(d, 3, 0), MakeBatch(d, 3, 0));
  EXPECT_NE(MakeBatch(d, 3, 0), MakeBatch(d, 4, 0));
  EXPECT_NE(MakeBatch(d, 3, 0), MakeBatch(d, 3, 1));
  SyntheticData other = d;
  other.seed = 6;
  EXPECT_NE(MakeBatch(d, 3, 0), MakeBatch(other, 3, 0));
  std::vector<int32_t> b = MakeBatch(d, 3, 0);
  ASSERT_EQ(b.size(), 4u * 11u);
  std::set<int32_t> seen(b.begin(), b.end());
  EXPECT_GE(*seen.begin(), 0);
  EXPECT_LT(*seen.rbegin(), 32);
}

TEST(SyntheticDataTest, NextTokenFollowsAFewAffinePatterns) {
  // Without noise a token has at most `patterns` successors.
  SyntheticData d{64, 20, 32, 9, /*patterns=*/3, /*noise=*/0.0f};
  std::vector<int32_t> b = MakeBatch(d, 1, 0);
  std::vector<std::set<int32_t>> successors(64);
  for (int s = 0; s < d.batch; ++s)
    for (int t = 0; t < d.seq; ++t)
      successors[b[s * 21 + t]].insert(b[s * 21 + t + 1]);
  for (const auto& next : successors) EXPECT_LE(next.size(), 3u);
}

}  // namespace
}  // namespace ckpt::worker
