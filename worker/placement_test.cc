#include "worker/placement.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ckpt::worker {
namespace {

TEST(PlacementTest, OffloadFractionOutsideUnitIntervalIsRefused) {
  for (double f : {-0.01, 1.01, double{NAN}, double{INFINITY}}) {
    absl::Status s = ValidateOffloadFraction(f);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_NE(std::string(s.message()).find("offload_fraction"),
              std::string::npos);
  }
  EXPECT_TRUE(ValidateOffloadFraction(0.0).ok());
  EXPECT_TRUE(ValidateOffloadFraction(1.0).ok());
}

TEST(PlacementTest, StaticKeepsTheUnoffloadedShareResident) {
  EXPECT_EQ(StaticResidentChunks(0.0, 10), 10u);
  EXPECT_EQ(StaticResidentChunks(1.0, 10), 0u);
  EXPECT_EQ(StaticResidentChunks(0.5, 10), 5u);
  EXPECT_EQ(StaticResidentChunks(0.26, 10), 7u);
}

TEST(PlacementTest, AutoBudgetBelowFixedBytesIsRefused) {
  DeviceFootprint f = FootprintOf(4, 100);  // fixed 4 * 100 * 6 = 2400
  EXPECT_EQ(f.fixed_bytes, 2400u);
  absl::Status s = ValidateAutoBudget(2399, f);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("2400"), std::string::npos);
  EXPECT_TRUE(ValidateAutoBudget(2400, f).ok());
}

TEST(PlacementTest, AutoKeepsAsManyChunksAsFitAfterTheNonModelPeak) {
  DeviceFootprint f =
      FootprintOf(4, 100);  // 2400 fixed, 1200 per resident chunk
  EXPECT_EQ(AutoResidentChunks(2400 + 3 * 1200 + 1199, 0, f, 4), 3u);
  EXPECT_EQ(AutoResidentChunks(2400 + 3 * 1200, 1, f, 4), 2u);
  EXPECT_EQ(AutoResidentChunks(2400 + 10 * 1200, 0, f, 4), 4u);
  EXPECT_EQ(AutoResidentChunks(2400 + 1000, 5000, f, 4), 0u);
}

}  // namespace
}  // namespace ckpt::worker
