// The coordinator's metrics (metrics.h) as a scrape would see them, driven
// through the state machine with the fake clock: latencies are exact.
#include <prometheus/text_serializer.h>

#include "coordinator/coordinator_testing.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

using ckpt::testing::SampleValue;

class CoordinatorMetricsTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    e1_ = Register("n1", 2);
    e2_ = Register("n2", 2);
    RegisterJob("job", 4);
  }
  std::string Text() {
    return prometheus::TextSerializer().Serialize(
        coord_->options().metrics->Collect());
  }
  void ReportAll(uint64_t step, v1::ShardState state) {
    for (uint32_t r = 0; r < 4; ++r) {
      auto s = Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, step, r, state);
      ASSERT_TRUE(s.ok()) << s.status();
    }
  }
  uint64_t e1_ = 0, e2_ = 0;
};

TEST_F(CoordinatorMetricsTest, CommitLatencyRunsFromFirstReportToGlobalCommit) {
  ReportAll(7, v1::STAGED);
  now_ms_ += 1500;
  ReportAll(7, v1::DURABLE);
  const std::string text = Text();
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_commit_seconds_count"), 1.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_commit_seconds_sum"), 1.5);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_steps_committed_total"), 1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_last_good_step",
                        {{"ckpt_job", "job"}}),
            7.0);
  EXPECT_GE(SampleValue(text, "ckpt_coordinator_last_good_step_age_seconds",
                        {{"ckpt_job", "job"}})
                .value_or(-1),
            0.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_nodes",
                        {{"state", "alive"}, {"role", "worker"}}),
            2.0);
}

TEST_F(CoordinatorMetricsTest,
       TrainerExitCountsAFailureAPlanAndTheRecoveryTime) {
  v1::ReportTrainerExitRequest exit;
  exit.set_node_id("n1");
  exit.set_epoch(e1_);
  exit.set_job("job");
  exit.set_rank(0);
  exit.set_term_signal(9);
  ASSERT_TRUE(coord_->ReportTrainerExit(exit).ok());
  std::string text = Text();
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_failures_detected_total",
                        {{"reason", "trainer_exit"}}),
            1.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_plans_total"), 1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_recovery_in_progress",
                        {{"ckpt_job", "job"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_recovery_seconds_count"), 0.0);
  now_ms_ += 2500;
  for (const auto& [node, epoch] :
       {std::pair{"n1", e1_}, std::pair{"n2", e2_}}) {
    auto orders = Heartbeat(node, epoch);
    ASSERT_TRUE(orders.ok()) << orders.status();
    std::vector<uint64_t> ids;
    for (const auto& o : orders->orders()) ids.push_back(o.id());
    ASSERT_TRUE(Heartbeat(node, epoch, ids).ok());
  }
  ASSERT_EQ(Job().plan_state(), v1::PLAN_ACKNOWLEDGED);
  text = Text();
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_recovery_seconds_count"), 1.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_recovery_seconds_sum"), 2.5);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_recovery_in_progress",
                        {{"ckpt_job", "job"}}),
            0.0);
}

TEST_F(CoordinatorMetricsTest, SilentNodeCountsANodeDeadFailureAndADeadNode) {
  now_ms_ += 10000;  // past the heartbeat timeout of both nodes
  ASSERT_TRUE(coord_->Tick().ok());
  const std::string text = Text();
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_failures_detected_total",
                        {{"reason", "node_dead"}}),
            2.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_nodes",
                        {{"state", "dead"}, {"role", "worker"}}),
            2.0);
  EXPECT_EQ(
      SampleValue(text, "ckpt_coordinator_lost_ranks", {{"ckpt_job", "job"}}),
      4.0);
}

}  // namespace
}  // namespace ckpt::coordinator
