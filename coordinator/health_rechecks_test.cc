// HealthRechecks alone: request ids never repeat, and a heartbeat's report
// replaces only the checks it carries.
#include "coordinator/health_rechecks.h"

#include <gtest/gtest.h>

#include "coordinator/health_state.h"

namespace ckpt::coordinator {
namespace {

v1::HealthCheck Check(const std::string& name, double figure) {
  v1::HealthCheck c;
  c.set_name(name);
  c.set_passed(true);
  c.set_figure(figure);
  return c;
}

TEST(HealthRechecksTest, RequestIdsFollowTheFirst) {
  HealthRechecks r(1'000'000);
  EXPECT_EQ(r.NextRequest(), 1'000'001u);
  EXPECT_EQ(r.NextRequest(), 1'000'002u);
}

TEST(HealthRechecksTest, AReportReplacesOnlyTheChecksItCarries) {
  v1::NodeHealthReport node;
  *node.add_checks() = Check("memcpy", 10);
  *node.add_checks() = Check("network", 900);  // the coordinator's round
  *node.add_checks() = Check("trainer_unkillable", 0);  // a launcher's
  v1::NodeHealthReport fresh;
  *fresh.add_checks() = Check("memcpy", 12);
  *fresh.add_checks() = Check("shm", 1);
  HealthRechecks::Merge(fresh, &node);
  ASSERT_EQ(node.checks_size(), 4);
  EXPECT_EQ(node.checks(0).name(), "network");
  EXPECT_EQ(node.checks(1).name(), "trainer_unkillable");
  EXPECT_EQ(node.checks(2).name(), "memcpy");
  EXPECT_EQ(node.checks(2).figure(), 12);
  EXPECT_EQ(node.checks(3).name(), "shm");
}

TEST(HealthRechecksTest, AReportKeepsAtMostTheLargestNumberOfChecks) {
  v1::NodeHealthReport node;
  *node.add_checks() = Check("network", 900);
  v1::NodeHealthReport fresh;
  for (int i = 0; i < kMaxHealthChecks; ++i)
    *fresh.add_checks() = Check("c" + std::to_string(i), i);
  HealthRechecks::Merge(fresh, &node);
  EXPECT_EQ(node.checks_size(), kMaxHealthChecks);
  EXPECT_EQ(node.checks(0).name(), "network");
}

}  // namespace
}  // namespace ckpt::coordinator
