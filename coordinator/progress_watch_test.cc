// ProgressWatch alone: a node's relative times land on the coordinator's
// clock, and the hang scan runs at most every scan period.
#include "coordinator/progress_watch.h"

#include <gtest/gtest.h>

namespace ckpt::coordinator {
namespace {

TEST(ProgressWatchTest, ABeatIsOnTheCoordinatorsClock) {
  coord::v1::RankProgress p;
  p.set_has_step(true);
  p.set_step(12);
  p.set_ms_since_advance(300);
  p.set_step_ms_p50(90);
  p.set_step_ms_p99(120);
  p.set_compute_ms(70);
  p.set_has_pause(true);
  p.set_pause_ms(5000);
  p.set_ms_since_pause(200);
  p.set_pause_reason("eval");
  const RankBeat b = ProgressWatch::BeatOf(p, 10'000);
  EXPECT_TRUE(b.has_step);
  EXPECT_EQ(b.step, 12u);
  EXPECT_EQ(b.advanced_ms, 9'700);
  EXPECT_EQ(b.p50_ms, 90u);
  EXPECT_EQ(b.p99_ms, 120u);
  EXPECT_EQ(b.compute_ms, 70u);
  EXPECT_TRUE(b.has_pause);
  EXPECT_EQ(b.pause_end_ms, 10'000 - 200 + 5000);
  EXPECT_EQ(b.pause_reason, "eval");
}

TEST(ProgressWatchTest, TheHangScanRunsAtMostEveryScanPeriod) {
  ProgressWatch w(250);
  EXPECT_TRUE(w.ScanDue(-5)) << "the first scan is always due";
  EXPECT_FALSE(w.ScanDue(-5));
  EXPECT_FALSE(w.ScanDue(-5 + 249));
  EXPECT_TRUE(w.ScanDue(-5 + 250));
  EXPECT_FALSE(w.ScanDue(-5 + 251));
}

TEST(ProgressWatchTest, TheScanPeriodIsAHundredthOfTheShortestTimeout) {
  EXPECT_EQ(ProgressWatch::ScanMsFor(HangPolicy{}), ProgressWatch::kMaxScanMs)
      << "the defaults (120 s, 900 s): 1 s";
  EXPECT_EQ(ProgressWatch::ScanMsFor(
                HangPolicy{/*min_s=*/60, /*factor=*/10, /*first_step_s=*/600}),
            600);
  EXPECT_EQ(ProgressWatch::ScanMsFor(
                HangPolicy{/*min_s=*/300, /*factor=*/10, /*first_step_s=*/30}),
            300)
      << "the first step's allowance is the shorter";
  EXPECT_EQ(ProgressWatch::ScanMsFor(
                HangPolicy{/*min_s=*/5, /*factor=*/10, /*first_step_s=*/120}),
            ProgressWatch::kMinScanMs);
}

}  // namespace
}  // namespace ckpt::coordinator
