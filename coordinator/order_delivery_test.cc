// When a plan's orders reach a node, on a fake clock: an order goes out
// only once the batch that queued it is durable, also when the plan is made
// inside the very heartbeat that would answer with it (a timeout found by
// the call's preamble, a hang found in its progress reports). A coordinator
// that crashed before that commit would not know the order the node acted
// on; the node gets it with its next heartbeat after the commit.
#include <gtest/gtest.h>

#include <chrono>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class OrderDeliveryTest : public TwoNodeTest {
 protected:
  // Until `node` has an order whose batch is durable (what WatchNode
  // shows): waits for the group commit's durable changes, not for time.
  void AwaitDeliverable(const std::string& node) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    uint64_t seen = 0;
    while (coord_->NodeOrders(node).order_ids_size() == 0 &&
           std::chrono::steady_clock::now() < deadline)
      seen = coord_->WaitForChange(seen, deadline);
    ASSERT_GT(coord_->NodeOrders(node).order_ids_size(), 0)
        << "no order of " << node << " became durable";
  }
  // A heartbeat of `node` with progress of `ranks`, each at `step` and
  // last advanced `ms_since_advance` ago.
  absl::StatusOr<v1::HeartbeatResponse> Progress(
      const std::string& node, uint64_t epoch,
      const std::vector<uint32_t>& ranks, uint64_t step,
      uint64_t ms_since_advance) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    for (uint32_t rank : ranks) {
      v1::RankProgress* p = req.add_progress();
      p->set_job("job");
      p->set_rank(rank);
      p->set_has_step(true);
      p->set_step(step);
      p->set_ms_since_advance(ms_since_advance);
      p->set_step_ms_p99(1000);
      p->set_step_samples(100);
    }
    return coord_->Heartbeat(req);
  }
};

TEST_F(OrderDeliveryTest, ATimeoutFoundByAHeartbeatSendsItsOrdersAfterCommit) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1_).ok());
  ASSERT_TRUE(Heartbeat("s1", es_).ok());
  now_ms_ += 2000;  // n2 silent for 4 s > 3 s
  // n1's heartbeat: its preamble declares n2 dead and plans (n2's ranks to
  // the spare, n1's restart from memory).
  auto found = Heartbeat("n1", e1_);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(found->orders_size(), 0)
      << "an order went out in the reply whose batch queued it: "
      << found->orders(0).ShortDebugString();
  AwaitDeliverable("n1");
  auto next = Heartbeat("n1", e1_);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->orders_size(), 1);
  EXPECT_EQ(next->orders(0).kind(), v1::RESTART);
  EXPECT_EQ(next->orders(0).step(), 10u);
}

class OrderDeliveryHangTest : public OrderDeliveryTest {
 protected:
  void SetUp() override {
    hang_ = HangPolicy{/*min_s=*/60, /*factor=*/10, /*first_step_s=*/600};
    heartbeat_timeout_ms_ = 3'600'000;  // the nodes live; the ranks hang
    OrderDeliveryTest::SetUp();
  }
};

TEST_F(OrderDeliveryHangTest, AHangFoundByAHeartbeatSendsItsOrdersAfterCommit) {
  for (uint64_t step : {40, 41}) {  // out of the first step
    ASSERT_TRUE(Progress("n1", e1_, {0, 1}, step, 0).ok());
    ASSERT_TRUE(Progress("n2", e2_, {2, 3}, step, 0).ok());
    now_ms_ += 1'000;
  }
  ASSERT_FALSE(HasEvent(v1::HANG_DETECTED));
  now_ms_ += 61'000;
  // No rank advanced for 61 s > the 60 s floor: n2's heartbeat finds the
  // hang and plans a restart of every rank, n2's included.
  auto found = Progress("n2", e2_, {2, 3}, 41, 62'000);
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_TRUE(HasEvent(v1::HANG_DETECTED));
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(found->orders_size(), 0)
      << "an order went out in the reply whose batch queued it: "
      << found->orders(0).ShortDebugString();
  AwaitDeliverable("n2");
  auto next = Heartbeat("n2", e2_);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->orders_size(), 1);
  EXPECT_EQ(next->orders(0).kind(), v1::RESTART);
}

}  // namespace
}  // namespace ckpt::coordinator
