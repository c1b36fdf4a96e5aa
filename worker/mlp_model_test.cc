#include "worker/mlp_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <utility>

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

// A restart requested while a rank computes its share of a step that is
// about to be thrown away: the model asks at each phase and layer
// boundary and leaves at the first yes, and the aborted call leaves
// nothing behind that changes the next step (bit-identical gradients).
TEST(MlpModelTest, AStopAskedMidStepLeavesAtTheNextBoundaryHarmlessly) {
  MlpConfig c = Tiny();
  auto reference = MlpModel::Create(c);
  auto model = MlpModel::Create(c);
  ASSERT_TRUE(reference.ok() && model.ok());
  const std::vector<std::vector<float>> params = MlpInitialParams(c, 3);
  Load(*reference, params);
  Load(*model, params);
  const std::vector<int32_t> tokens = Batch(c, 1);
  absl::StatusOr<float> want = reference->ForwardBackward(tokens);
  ASSERT_TRUE(want.ok());

  // Never stopping: asked at every boundary, and the same result.
  int asked = 0;
  absl::StatusOr<float> full = model->ForwardBackward(tokens, [&] {
    ++asked;
    return false;
  });
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(*full, *want);
  // After the forward pass, the loss, and each layer of the backward pass.
  EXPECT_GE(asked, 2 + c.layers);

  for (int stop_at = 1; stop_at <= asked; ++stop_at) {
    int n = 0;
    absl::StatusOr<float> cut =
        model->ForwardBackward(tokens, [&] { return ++n >= stop_at; });
    EXPECT_EQ(cut.status().code(), absl::StatusCode::kAborted)
        << "stopped at boundary " << stop_at;
    EXPECT_EQ(n, stop_at) << "it went on asking after the first yes";
    absl::StatusOr<float> again = model->ForwardBackward(tokens);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *want);
    for (size_t i = 0; i < params.size(); ++i) {
      std::span<const float> g = model->gradients(i);
      std::span<const float> r = std::as_const(*reference).gradients(i);
      ASSERT_TRUE(std::equal(g.begin(), g.end(), r.begin(), r.end()))
          << "tensor " << i << " after a stop at boundary " << stop_at;
    }
  }
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
