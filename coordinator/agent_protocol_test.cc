// The protocol between ckptd's node agent and the coordinator when writes
// of the coordinator's state are lost or fail, and when a node is fenced:
// a real agent (no engine) against a real in-process server on loopback
// (server_testing.h). Each test is the scenario of a review finding
// (doc: ../shared/review/correctness.md, findings 2, 8 and 12).
#include <filesystem>
#include <memory>

#include "coordinator/server_testing.h"
#include "storage/manifest.h"

namespace ckpt::coordinator {
namespace {

using Fault = FaultyKv::Fault;
using std::chrono::seconds;

// The first group write that acknowledges an order (deletes "O/...") gets
// `fault`; every other write goes through.
FaultyKv::Rule OnFirstAck(Fault fault) {
  auto armed = std::make_shared<std::atomic<bool>>(true);
  return [armed, fault](const std::vector<const KvBatch*>& batches) {
    if (FaultyKv::Deletes(batches, "O/") && armed->exchange(false))
      return fault;
    return Fault::kNone;
  };
}

// Finding 2: the agent acknowledged the RESTART, the coordinator answered
// and died before the acknowledgement was durable. The restarted one still
// has the order and sends it again; the agent must acknowledge it again,
// or the plan waits forever (and ckptrun with it).
TEST_F(ServerTest,
       AckLostInACoordinatorCrashIsSentAgainAndThePlanIsAcknowledged) {
  Start(0, 16, OnFirstAck(Fault::kLose));
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  TrainerDied("n1", agent->epoch(), 1);
  ASSERT_TRUE(Eventually([&] { return faulty_->fired(); }))
      << "the order was never acknowledged";
  Restart();
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED)
      << "the acknowledgement was lost with the crash";
  EXPECT_TRUE(Eventually(
      [&] { return Job().plan_state() == v1::PLAN_ACKNOWLEDGED; }, seconds(15)))
      << "plan state " << v1::PlanState_Name(Job().plan_state());
}

// Finding 2, the same through a failed group write: the coordinator goes
// back to its store, where the order is still pending.
TEST_F(ServerTest, AckOfAFailedGroupWriteIsSentAgainAndThePlanIsAcknowledged) {
  Start(0, 16, OnFirstAck(Fault::kFail));
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  TrainerDied("n1", agent->epoch(), 1);
  ASSERT_TRUE(Eventually([&] { return faulty_->fired(); }))
      << "the order was never acknowledged";
  EXPECT_TRUE(Eventually(
      [&] { return Job().plan_state() == v1::PLAN_ACKNOWLEDGED; }, seconds(15)))
      << "plan state " << v1::PlanState_Name(Job().plan_state());
}

// Finding 12: a failed group write makes the coordinator reload its state,
// which drops every per-rank report (soft state). Nodes send those again
// only to a new incarnation; without one, the step's DURABLE reports are
// refused as "never staged" and the step never commits.
TEST_F(ServerTest, StepInFlightWhenAGroupWriteFailsStillCommits) {
  auto armed = std::make_shared<std::atomic<bool>>(false);
  Start(0, 16, [armed](const std::vector<const KvBatch*>&) {
    return armed->exchange(false) ? Fault::kFail : Fault::kNone;
  });
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  agent->Report(Shard(0, false));
  agent->Report(Shard(1, false));
  ASSERT_TRUE(
      Eventually([&] { return CountEvents(v1::STEP_STAGED, "step 3") == 1; }));
  const uint64_t incarnation = server_->coordinator()->incarnation();
  *armed = true;
  v1::RegisterNodeRequest other;  // any write: this one fails
  other.set_node_id("n2");
  other.set_capacity(1);
  auto r = server_->coordinator()->RegisterNode(other);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected"), absl::string_view::npos)
      << r.status();
  EXPECT_NE(server_->coordinator()->incarnation(), incarnation)
      << "the reloaded state lost the soft state: nodes must see a new "
         "incarnation";
  agent->Report(Shard(0, true));
  agent->Report(Shard(1, true));
  EXPECT_TRUE(Eventually([&] { return Job().has_last_good(); }, seconds(15)))
      << "resent " << agent->reports_resent();
  EXPECT_EQ(Job().last_good_step(), 3u);
}

// Finding 8: a shard committed while the node is fenced (declared dead;
// its agent has not registered again yet) belongs to the abandoned
// generation. It must never count, not even under the node's next epoch.
TEST_F(ServerTest, ShardCommittedWhileFencedNeverCountsUnderTheNextEpoch) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  const uint64_t first = agent->epoch();
  RegisterJob(1);
  // Registrations are refused for now (load shedding), so the agent stays
  // fenced while the shard is committed.
  server_->SetMaxInflightReports(0);
  skew_ms_ += 10 * heartbeat_timeout_ms_;  // n1 missed its heartbeats: dead
  ASSERT_TRUE(Eventually([&] { return agent->epoch() == 0; }))
      << "the agent never saw the fence";
  agent->Report(Shard(0, false, 3));
  agent->Report(Shard(0, true, 3));
  server_->SetMaxInflightReports(16);
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > first; }));
  // A shard of the new epoch commits: every report queued before it was
  // sent (or dropped) by then.
  agent->Report(Shard(0, false, 4));
  agent->Report(Shard(0, true, 4));
  ASSERT_TRUE(Eventually([&] {
    return Job().has_last_good() && Job().last_good_step() == 4;
  })) << "last good "
      << Job().last_good_step();
  EXPECT_EQ(agent->reports_dropped(), 2u);
  EXPECT_EQ(CountEvents(v1::STEP_STAGED, "step 3"), 0);
  EXPECT_EQ(CountEvents(v1::STEP_DURABLE, "step 3"), 0);
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/shared/" +
                                       storage::GlobalManifestKey("job", 3)));
}

// Findings 9 and 18: what the daemon knows of a save reaches the
// coordinator: the generation it was made in (none when the trainer sent
// none) and a persist that failed for good.
TEST(ReportProtoTest, CarriesTheGenerationAndAFailureOfTheSave) {
  daemon::ShardReport report;
  report.job = "job";
  report.step = 5;
  report.rank = 1;
  coord::v1::ShardReport plain;
  daemon::ToReportProto(report, &plain);
  EXPECT_FALSE(plain.has_generation());
  EXPECT_FALSE(plain.has_failed());
  report.generation = 4;
  report.failed = true;
  coord::v1::ShardReport out;
  daemon::ToReportProto(report, &out);
  ASSERT_TRUE(out.has_generation());
  EXPECT_EQ(out.generation(), 4u);
  EXPECT_TRUE(out.failed());
}

// Finding 22: the agent remembers the orders it carried out (to answer a
// re-sent one without running it twice), but not every order of the
// node's life: one plan after another leaves it a bounded memory.
TEST_F(ServerTest, AgentRemembersABoundedNumberOfCarriedOutOrders) {
  Start();
  auto agent = Agent("n1", /*remembered_orders=*/3);
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(1);
  for (uint64_t generation = 0; generation < 8; ++generation) {
    TrainerDied("n1", agent->epoch(), 0);
    ASSERT_TRUE(Eventually([&] { return Job().plan_state() == v1::PLAN_ACKNOWLEDGED; }))
        << "plan of generation " << generation + 1 << " never acknowledged";
  }
  EXPECT_EQ(Job().generation(), 8u);
  EXPECT_LE(agent->orders_remembered(), 3u);
  EXPECT_EQ(agent->prefetch_threads(), 0u);
}

}  // namespace
}  // namespace ckpt::coordinator
