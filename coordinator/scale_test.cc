// The coordinator at scale, with real parts: batched per-node reports,
// placement that honours what each launcher runs, the WatchJob stream a
// launcher learns plans from, and a real node agent (ckptd's, without an
// engine) against an in-process coordinator server on loopback: a report
// call answered RESOURCE_EXHAUSTED is retried, never dropped, and a
// restarted coordinator gets the per-rank soft state again.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "coordinator.grpc.pb.h"
#include "coordinator/coordinator_testing.h"
#include "coordinator/server_testing.h"

namespace ckpt::coordinator {
namespace {

TEST_F(CoordinatorTest, BatchedReportsOfEveryRankCommitAStep) {
  uint64_t e1 = Register("n1", 4), e2 = Register("n2", 4);
  RegisterJob("job", 8);
  for (auto state : {v1::STAGED, v1::DURABLE}) {
    auto a = coord_->ReportShards(NodeBatch("n1", e1, 7, {0, 1, 2, 3}, state));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_EQ(a->results_size(), 4);
    for (const auto& r : a->results()) EXPECT_EQ(r.code(), 0) << r.message();
    EXPECT_FALSE(a->results(3).durable_everywhere());
    auto b = coord_->ReportShards(NodeBatch("n2", e2, 7, {4, 5, 6, 7}, state));
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->results(3).staged_everywhere(), true);
    EXPECT_EQ(b->results(3).durable_everywhere(), state == v1::DURABLE);
  }
  EXPECT_TRUE(Job().has_last_good());
  EXPECT_EQ(Job().last_good_step(), 7u);
  // A refused report in a batch refuses only itself.
  v1::ReportShardsRequest mixed = NodeBatch("n1", e1, 8, {0, 5}, v1::STAGED);
  auto m = coord_->ReportShards(mixed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->results(0).code(), 0);
  EXPECT_EQ(m->results(1).code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(m->results(1).message().find("hosted by node n2"),
            std::string::npos)
      << m->results(1).message();
}

TEST_F(CoordinatorTest,
       TwoOneProcLaunchersOnDefaultCapacityNodesGetOneRankEach) {
  Register("a", 8);
  Register("b", 8);
  v1::RegisterJobRequest req;  // ckptrun --nproc-per-node 1 --nnodes 2
  req.set_job("job");
  req.set_world_size(2);
  req.set_nproc_per_node(1);
  auto r = coord_->RegisterJob(req);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->job().rank_node_size(), 2);
  EXPECT_EQ(r->job().rank_node(0), "a");
  EXPECT_EQ(r->job().rank_node(1), "b");
  EXPECT_EQ(coord_->View("job", "b").ranks_size(), 1);
}

TEST_F(CoordinatorTest,
       RegistrationOfAnotherNodeMakesNoNewPlanWhileRanksWaitForTheirNode) {
  uint64_t e1 = Register("n1", 2);
  Register("n2", 2);
  RegisterJob("job", 4);
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  now_ms_ += 2000;  // n2 dead, no spare: its ranks wait
  ASSERT_TRUE(coord_->Tick().ok());
  ASSERT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  uint64_t generation = Job().generation();
  Register("n3", 2);  // neither n2 nor a spare: nothing changes for the job
  EXPECT_EQ(Job().generation(), generation);
  Register("n2", 2);  // its ranks' node is back: a plan
  EXPECT_EQ(Job().generation(), generation + 1);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
}

TEST_F(ServerTest, ResourceExhaustedReportsAreRetriedNotDropped) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  server_->SetMaxInflightReports(0);  // shedding every report call
  for (bool durable : {false, true})
    for (uint32_t r : {0u, 1u}) agent->Report(Shard(r, durable));
  ASSERT_TRUE(Eventually([&] { return agent->report_retries() >= 3; }));
  EXPECT_FALSE(Job().has_last_good());
  server_->SetMaxInflightReports(16);  // load gone: the same reports go through
  ASSERT_TRUE(Eventually([&] { return Job().has_last_good(); }));
  EXPECT_EQ(Job().last_good_step(), 3u);
}

TEST_F(ServerTest, RestartedCoordinatorGetsSoftStateAgainAndTheStepCommits) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  agent->Report(Shard(0, false));
  agent->Report(Shard(1, false));
  auto staged = [&] {
    v1::EventsResponse events = server_->coordinator()->Events({});
    for (const auto& e : events.events())
      if (e.kind() == v1::STEP_STAGED) return true;
    return false;
  };
  ASSERT_TRUE(Eventually(staged));
  // Restart on the same state and port: the per-rank reports are gone.
  int port = server_->port();
  server_.reset();
  Start(port);
  EXPECT_FALSE(Job().has_last_good());
  agent->Report(Shard(0, true));
  agent->Report(Shard(1, true));
  ASSERT_TRUE(Eventually([&] { return Job().has_last_good(); }))
      << "resent " << agent->reports_resent() << "\n"
      << [&] {
           std::string all;
           const v1::EventsResponse events = server_->coordinator()->Events({});
           for (const auto& e : events.events())
             all += v1::EventKind_Name(e.kind()) + " " + e.node_id() + ": " +
                    e.detail() + "\n";
           return all;
         }();
  EXPECT_EQ(Job().last_good_step(), 3u);
  EXPECT_GE(agent->reports_resent(), 2u);
}

TEST_F(ServerTest, WatchJobStreamsTheNewPlanWithoutPolling) {
  Start();
  auto stub = v1::CoordinatorWatch::NewStub(
      grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  Coordinator* c = server_->coordinator();
  v1::RegisterNodeRequest n;
  n.set_node_id("n1");
  n.set_capacity(2);
  auto reg = c->RegisterNode(n);
  ASSERT_TRUE(reg.ok());
  RegisterJob(2);
  grpc::ClientContext ctx;
  v1::WatchJobRequest req;
  req.set_job("job");
  req.set_node_id("n1");
  auto reader = stub->WatchJob(&ctx, req);
  v1::JobView view;
  ASSERT_TRUE(reader->Read(&view));
  EXPECT_TRUE(view.registered());
  EXPECT_EQ(view.generation(), 0u);
  EXPECT_EQ(view.ranks_size(), 2);
  EXPECT_EQ(view.node_health(), v1::ALIVE);
  v1::ReportTrainerExitRequest exit;  // a trainer dies: a plan
  exit.set_node_id("n1");
  exit.set_epoch(reg->epoch());
  exit.set_job("job");
  exit.set_rank(1);
  exit.set_exit_code(3);
  ASSERT_TRUE(c->ReportTrainerExit(exit).ok());
  do {
    ASSERT_TRUE(reader->Read(&view));  // pushed, not polled
  } while (view.generation() == 0);
  EXPECT_EQ(view.generation(), 1u);
  EXPECT_EQ(view.plan_state(), v1::PLAN_ORDERED);
  ctx.TryCancel();
  reader->Finish().ok();
}

}  // namespace
}  // namespace ckpt::coordinator
