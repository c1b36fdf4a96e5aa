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

// A restore that fell back is an event a person can read and a counter per
// job and failed copy; the restore itself is the node's business.
TEST_F(CoordinatorMetricsTest,
       ReportedFallbackIsAnEventAndCountedPerJobAndCopy) {
  v1::ReportFallbackRequest req;
  req.set_node_id("n2");
  req.set_epoch(e2_);
  req.set_job("job");
  req.set_step(40);
  req.set_rank(3);
  req.set_copy("memory");
  req.set_reason("checksum mismatch in tensor w");
  req.set_next_copy("file");
  auto r = coord_->ReportFallback(req);
  ASSERT_TRUE(r.ok()) << r.status();
  req.set_copy("object");
  req.set_reason("object missing");
  req.set_next_step(30);
  req.clear_next_copy();
  r = coord_->ReportFallback(req);
  ASSERT_TRUE(r.ok()) << r.status();

  std::vector<v1::Event> fallbacks;
  const v1::EventsResponse events = coord_->Events({});
  for (const v1::Event& e : events.events())
    if (e.kind() == v1::FALLBACK) fallbacks.push_back(e);
  ASSERT_EQ(fallbacks.size(), 2u);
  EXPECT_EQ(fallbacks[0].job(), "job");
  EXPECT_EQ(fallbacks[0].node_id(), "n2");
  EXPECT_EQ(fallbacks[0].detail(),
            "rank 3 step 40: memory copy failed verification (checksum "
            "mismatch in tensor w); "
            "restored from file");
  EXPECT_EQ(fallbacks[1].detail(),
            "rank 3 step 40: object copy failed verification (object missing); "
            "fell back to step 30");
  // The same as fields, for scripts.
  EXPECT_EQ(fallbacks[0].fallback().copy(), "memory");
  EXPECT_EQ(fallbacks[0].fallback().next_copy(), "file");
  EXPECT_FALSE(fallbacks[0].fallback().has_next_step());
  EXPECT_EQ(fallbacks[1].fallback().rank(), 3u);
  EXPECT_EQ(fallbacks[1].fallback().step(), 40u);
  EXPECT_EQ(fallbacks[1].fallback().reason(), "object missing");
  EXPECT_EQ(fallbacks[1].fallback().next_step(), 30u);

  Reopen();  // the events are durable state
  int durable = 0;
  const v1::EventsResponse reopened = coord_->Events({});
  for (const v1::Event& e : reopened.events())
    durable += e.kind() == v1::FALLBACK;
  EXPECT_EQ(durable, 2);
}

TEST_F(CoordinatorMetricsTest, FallbacksAreCountedPerJobAndFailedCopy) {
  v1::ReportFallbackRequest req;
  req.set_node_id("n1");
  req.set_epoch(e1_);
  req.set_job("job");
  req.set_step(12);
  req.set_rank(0);
  req.set_reason("bad footer");
  for (const char* copy : {"memory", "memory", "file"}) {
    req.set_copy(copy);
    ASSERT_TRUE(coord_->ReportFallback(req).ok());
  }
  const std::string text = Text();
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_restore_fallbacks_total",
                        {{"ckpt_job", "job"}, {"copy", "memory"}}),
            2.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_restore_fallbacks_total",
                        {{"ckpt_job", "job"}, {"copy", "file"}}),
            1.0)
      << text;
}

}  // namespace
}  // namespace ckpt::coordinator
