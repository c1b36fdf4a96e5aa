// A job whose every plan fails is held: the coordinator makes at most
// max_failed_plans plans without a commit, then holds the job (event
// JOB_HELD, durable) until an operator resumes it (Coordinator::Resume).
#include <gtest/gtest.h>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class HeldPlanTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    cordon_.after = 0;  // the repeated exits on n2 cordon nothing
    TwoNodeTest::SetUp();
  }
  // Rank 3 on n2 exits with code 1 in the current generation, as a rank
  // whose restore fails deterministically does after every plan.
  void ExitAgain() {
    auto r = coord_->ReportTrainerExit(TrainerExit("n2", e2_, 3, 0, 1));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // Both nodes take the plan's orders and acknowledge them (the trainers
  // restart, as they do before failing again).
  void AckOrders() {
    for (auto [node, epoch] : {std::pair{"n1", e1_}, std::pair{"n2", e2_}}) {
      auto hb = Heartbeat(node, epoch);
      ASSERT_TRUE(hb.ok()) << hb.status();
      std::vector<uint64_t> ids;
      for (const auto& o : hb->orders()) ids.push_back(o.id());
      ASSERT_TRUE(Heartbeat(node, epoch, ids).ok());
    }
  }
  size_t Plans() { return EventsOf(v1::PLAN_MADE).size(); }
};

TEST_F(HeldPlanTest, ExitsWithoutACommitMakeAtMostTheLimitOfPlans) {
  for (int i = 0; i < 14; ++i) {
    ExitAgain();
    AckOrders();
  }
  EXPECT_EQ(Plans(), 10u);  // the default limit
}

}  // namespace
}  // namespace ckpt::coordinator
