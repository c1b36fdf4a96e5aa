// ckptrun and the coordinator's plans: a replacement node's
// trainers start while its PREFETCH still runs, once every node
// acknowledged its RESTART (JobView.trainers_may_start).
#include "coordinator.grpc.pb.h"
#include "storage/shard_format.h"
#include "tools/ckptrun_fixture.h"

namespace ckpt::tools {
namespace {

// The job's record as the coordinator has it now.
cv1::JobRecord TrainJob(cv1::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  cv1::GetClusterResponse c;
  EXPECT_TRUE(stub->GetCluster(&ctx, {}, &c).ok());
  for (const auto& j : c.jobs())
    if (j.job() == "train") return j;
  return {};
}

TEST_F(CkptrunTest, AReplacementsTrainersStartWhileItsPrefetchRuns) {
  testing::FakeNode n1(coord_->address(), "n1", "", 1);
  auto n2 = std::make_unique<testing::FakeNode>(coord_->address(), "n2", "", 1);
  testing::FakeNode s1(coord_->address(), "s1", "", 1, /*spare=*/true);
  ASSERT_TRUE(n1.status().ok() && n2->status().ok() && s1.status().ok());
  s1.set_ack_prefetch(false);  // its fetch never ends
  // Registers the job: rank 0 on n1, rank 1 on n2.
  StartCkptrun("idle", 1, "s1", {"--nnodes", "2"});
  ASSERT_TRUE(WaitFor([&] { return TrainJob(stub_.get()).world_size() == 2; },
                      milliseconds(15000)));
  for (auto state : {cv1::STAGED, cv1::DURABLE}) {
    ASSERT_TRUE(
        n1.ReportShard("train", 7, 0, state, storage::ShardKey("train", 7, 0))
            .ok());
    ASSERT_TRUE(
        n2->ReportShard("train", 7, 1, state, storage::ShardKey("train", 7, 1))
            .ok());
  }
  n2.reset();  // silent: declared dead, rank 1 moves to s1
  ASSERT_TRUE(WaitForEnv(1, {1})) << "the replacement's trainer never started";
  EXPECT_EQ(Env(1, 1)["CKPT_RESTORE_STEP"], "7");
  cv1::JobRecord job = TrainJob(stub_.get());
  EXPECT_EQ(job.rank_node(1), "s1");
  EXPECT_EQ(job.plan_state(), cv1::PLAN_ORDERED)
      << "started before every order was acknowledged";
}

}  // namespace
}  // namespace ckpt::tools
