// The timeout model alone (hang_model.h): pure functions of reports and a
// clock value.
#include "coordinator/hang_model.h"

#include "gtest/gtest.h"

namespace ckpt::coordinator {
namespace {

RankBeat Beat(uint64_t step, int64_t advanced_ms, uint32_t p99_ms = 1000) {
  RankBeat b;
  b.has_step = true;
  b.step = step;
  b.advanced_ms = advanced_ms;
  b.p99_ms = p99_ms;
  return b;
}

const HangPolicy kPolicy{/*min_s=*/60, /*factor=*/10, /*first_step_s=*/600};

TEST(HangModelTest, TimeoutIsTheFloorOrTheFactorTimesP99) {
  EXPECT_DOUBLE_EQ(HangTimeoutS(kPolicy, Beat(1, 0, 1000)), 60);
  EXPECT_DOUBLE_EQ(HangTimeoutS(kPolicy, Beat(1, 0, 30'000)), 300);
}

TEST(HangModelTest, SlowFirstStepIsNoHangUntilTheFirstStepTimeout) {
  const int64_t start = 10'000;
  // Reports of the previous generation (before the start): first step.
  std::map<uint32_t, RankBeat> beats{{0, Beat(5, 9'000)}, {1, Beat(5, 9'000)}};
  EXPECT_FALSE(FindHang(kPolicy, {0, 1}, beats, start, start + 599'000));
  auto v = FindHang(kPolicy, {0, 1}, beats, start, start + 600'001);
  ASSERT_TRUE(v);
  EXPECT_TRUE(v->first_step);
  EXPECT_DOUBLE_EQ(v->timeout_s, 600);
}

TEST(HangModelTest, AfterTheFirstAdvanceTheStepTimeoutApplies) {
  const int64_t start = 0;
  std::map<uint32_t, RankBeat> beats{{0, Beat(6, 5'000)}};
  EXPECT_FALSE(FindHang(kPolicy, {0}, beats, start, 65'000));
  auto v = FindHang(kPolicy, {0}, beats, start, 65'001);
  ASSERT_TRUE(v);
  EXPECT_FALSE(v->first_step);
  EXPECT_EQ(v->stuck, std::vector<uint32_t>{0});
  EXPECT_EQ(v->step, 6u);
}

TEST(HangModelTest, ADeclaredPauseExtendsTheDeadlineOnce) {
  RankBeat b = Beat(50, 1'000);
  b.has_pause = true;
  b.pause_end_ms = 1'000 + 300'000;  // evaluation: 5 minutes
  b.pause_reason = "evaluation";
  std::map<uint32_t, RankBeat> beats{{0, b}};
  // Without the pause it would be hung at 61 s; with it, at 361 s.
  EXPECT_FALSE(FindHang(kPolicy, {0}, beats, 0, 100'000));
  EXPECT_FALSE(FindHang(kPolicy, {0}, beats, 0, 361'000));
  auto v = FindHang(kPolicy, {0}, beats, 0, 361'001);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->pause_reason, "evaluation");
  EXPECT_NE(v->detail.find("evaluation"), std::string::npos);
}

TEST(HangModelTest, TheRankBehindIsNamedNotTheRanksThatWaitForIt) {
  std::map<uint32_t, RankBeat> beats;
  for (uint32_t r = 0; r < 8; ++r) beats[r] = Beat(42, 2'000);
  beats[5] = Beat(41, 1'000);
  std::vector<uint32_t> ranks{0, 1, 2, 3, 4, 5, 6, 7};
  auto v = FindHang(kPolicy, ranks, beats, 0, 70'000);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<uint32_t>{5});
  EXPECT_EQ(v->step, 41u);
  EXPECT_EQ(v->detail.substr(0, 26), "rank 5 stopped at step 41,");
  EXPECT_NE(v->detail.find("ranks 0-4,6-7 are ahead"), std::string::npos);
}

TEST(HangModelTest, AtTheSameStepTheRankWhoseProgressStoppedFirstIsNamed) {
  std::map<uint32_t, RankBeat> beats{
      {0, Beat(9, 10'000)}, {1, Beat(9, 13'000)}, {2, Beat(9, 13'100)}};
  auto v = FindHang(kPolicy, {0, 1, 2}, beats, 0, 75'000);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<uint32_t>{0});
}

TEST(HangModelTest, ARankThatNeverReportedIsBehindTheOthers) {
  std::map<uint32_t, RankBeat> beats{{0, Beat(1, 700'000)}};
  auto v = FindHang(kPolicy, {0, 1}, beats, 0, 700'000);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->stuck, std::vector<uint32_t>{1});
  EXPECT_FALSE(v->has_step);
  EXPECT_TRUE(v->first_step);
}

TEST(HangModelTest, AJobWithoutBeaconsOrSavesIsNotWatched) {
  EXPECT_FALSE(FindHang(kPolicy, {0, 1}, {}, 0, 10'000'000));
}

TEST(HangModelTest, RankRangesAreCompact) {
  EXPECT_EQ(RankRanges({7, 0, 1, 2, 4, 6}), "0-2,4,6-7");
  EXPECT_EQ(RankRanges({3}), "3");
}

}  // namespace
}  // namespace ckpt::coordinator
