// The protocol between ckptd's node agent and the coordinator when writes
// of the coordinator's state are lost or fail, and when a node is fenced:
// a real agent (no engine) against a real in-process server on loopback
// (server_testing.h). Each test is the scenario of a review finding
// (doc: ../shared/review/correctness.md, findings 2, 8 and 12).
#include <filesystem>
#include <memory>

#include "coordinator/client/leader_channel.h"
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

// The agent acknowledged the RESTART, the coordinator answered
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

// An order reaches the
// agent as soon as it is durable (WatchNode), and its acknowledgement goes
// at once. With a 60 s heartbeat timeout the agent heartbeats every 12 s;
// before, the RESTART waited for the next heartbeat and its
// acknowledgement for the one after (12 s or more).
TEST_F(ServerTest, OrderArrivesAndIsAcknowledgedWithoutWaitingForHeartbeats) {
  heartbeat_timeout_ms_ = 60000;
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  const auto failed = std::chrono::steady_clock::now();
  TrainerDied("n1", agent->epoch(), 1);
  EXPECT_TRUE(Eventually(
      [&] { return Job().plan_state() == v1::PLAN_ACKNOWLEDGED; }, seconds(6)))
      << "plan state " << v1::PlanState_Name(Job().plan_state()) << " after "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       failed)
             .count()
      << " s";
  EXPECT_EQ(CountEvents(v1::ORDER_ACKED), CountEvents(v1::ORDER_SENT));
}

// The order watch validates what it is given: a node id that is not a
// name is refused naming the field, and the server serves on.
TEST_F(ServerTest, OrderWatchOfABadNodeIdIsRefusedNamingTheField) {
  Start();
  auto watch = v1::CoordinatorWatch::NewStub(
      grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  for (const char* bad : {"../etc", ""}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    v1::WatchNodeRequest req;
    req.set_node_id(bad);
    auto reader = watch->WatchNode(&ctx, req);
    v1::NodeView view;
    EXPECT_FALSE(reader->Read(&view));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
    EXPECT_NE(s.error_message().find("node_id"), std::string::npos)
        << s.error_message();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::WatchNodeRequest req;
  req.set_node_id("n1");
  auto reader = watch->WatchNode(&ctx, req);
  v1::NodeView view;
  EXPECT_TRUE(reader->Read(&view)) << "a good watch after the refusals";
  EXPECT_EQ(view.order_ids_size(), 0);
  ctx.TryCancel();
  reader->Finish();
}

// The same through a failed group write: the coordinator goes
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

// A failed group write makes the coordinator reload its state,
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

// A shard committed while the node is fenced (declared dead;
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

// The agent remembers the orders it carried out (to answer a
// re-sent one without running it twice), but not every order of the
// node's life: one plan after another leaves it a bounded memory.
TEST_F(ServerTest, AgentRemembersABoundedNumberOfCarriedOutOrders) {
  Start();
  auto agent = Agent("n1", /*remembered_orders=*/3);
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(1);
  for (uint64_t generation = 0; generation < 8; ++generation) {
    TrainerDied("n1", agent->epoch(), 0);
    ASSERT_TRUE(Eventually([&] {
      return Job().plan_state() == v1::PLAN_ACKNOWLEDGED;
    })) << "plan of generation "
        << generation + 1 << " never acknowledged";
  }
  EXPECT_EQ(Job().generation(), 8u);
  EXPECT_LE(agent->orders_remembered(), 3u);
  EXPECT_EQ(agent->prefetch_threads(), 0u);
}

daemon::FallbackReport MemoryCopyFailed(uint32_t rank) {
  daemon::FallbackReport f;
  f.job = "job";
  f.step = 3;
  f.rank = rank;
  f.copy = "memory";
  f.reason = "checksum mismatch in tensor w";
  f.next_copy = "file";
  return f;
}

// A restore that fell back reaches the coordinator as an event,
// sent by the agent's report thread; the caller (the engine) never waits.
TEST_F(ServerTest, AgentSendsAFallbackReportAndTheCoordinatorRecordsIt) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  agent->ReportFallback(MemoryCopyFailed(1));
  EXPECT_TRUE(Eventually([&] {
    return CountEvents(v1::FALLBACK,
                       "rank 1 step 3: memory copy failed verification "
                       "(checksum mismatch in tensor w); restored from file") ==
           1;
  }));
  // Counted once the agent has the answer, which may come after the event.
  EXPECT_TRUE(Eventually([&] { return agent->fallbacks_sent() == 1u; }));
  EXPECT_EQ(agent->fallbacks_dropped(), 0u);
}

// A copy a client claimed bad that the node verified (and kept) reaches
// the event log as such: a sign about the node, not about the copy.
TEST_F(ServerTest, FallbackClaimTheNodeFoundGoodIsRecordedAsVerified) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  daemon::FallbackReport claim = MemoryCopyFailed(1);
  claim.verified_bad = false;
  claim.next_copy = "memory";
  agent->ReportFallback(claim);
  ASSERT_TRUE(Eventually([&] { return agent->fallbacks_sent() == 1u; }));
  int found = 0;
  const v1::EventsResponse events = server_->coordinator()->Events({});
  for (const auto& e : events.events()) {
    if (e.kind() != v1::FALLBACK) continue;
    ++found;
    ASSERT_TRUE(e.fallback().has_verified_bad()) << e.detail();
    EXPECT_FALSE(e.fallback().verified_bad());
    EXPECT_NE(e.detail().find("verified by the node"), std::string::npos)
        << e.detail();
  }
  EXPECT_EQ(found, 1);
}

// The coordinator is down: ReportFallback still returns at once, and the
// report goes out when the coordinator is back.
TEST_F(ServerTest,
       FallbackReportNeverBlocksOnADownCoordinatorAndIsSentWhenItReturns) {
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  const int port = server_->port();
  server_.reset();
  const auto before = std::chrono::steady_clock::now();
  agent->ReportFallback(MemoryCopyFailed(0));
  // Far below the RPC timeout a blocking send would wait for (a loaded or
  // sanitized run included): the call only queues.
  EXPECT_LT(std::chrono::steady_clock::now() - before,
            std::chrono::milliseconds(500));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Start(port);
  EXPECT_TRUE(Eventually(
      [&] { return CountEvents(v1::FALLBACK, "rank 0 step 3") == 1; }));
  EXPECT_TRUE(Eventually([&] { return agent->fallbacks_sent() == 1u; }));
}

// Unreachable for longer than fallback_ttl: the report is dropped (and
// counted), never sent late.
TEST_F(ServerTest, FallbackReportOlderThanItsTtlIsDroppedNotSentLate) {
  Start();
  daemon::NodeAgentOptions o;
  o.coordinator = Address();
  o.node_id = "n1";
  o.address = "127.0.0.1:1";
  o.capacity = 2;
  o.rpc_timeout = std::chrono::milliseconds(2000);
  o.fallback_ttl = std::chrono::milliseconds(200);
  auto agent = std::make_unique<daemon::NodeAgent>(o);
  agent->Start(nullptr);
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  RegisterJob(2);
  const int port = server_->port();
  server_.reset();
  agent->ReportFallback(MemoryCopyFailed(0));
  EXPECT_TRUE(
      Eventually([&] { return agent->fallbacks_dropped() == 1; }, seconds(10)));
  Start(port);
  // Rank 1's reports prove the agent is connected again (gRPC's reconnect
  // backoff can outlast the 200 ms TTL on a loaded or sanitized run, so
  // one is sent every 300 ms until one gets through); by then rank 0's
  // dropped report would have been sent, had it been kept.
  EXPECT_TRUE(Eventually([&] {
    if (agent->fallbacks_sent() >= 1) return true;
    agent->ReportFallback(MemoryCopyFailed(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return agent->fallbacks_sent() >= 1;
  }));
  EXPECT_EQ(CountEvents(v1::FALLBACK, "rank 0 step 3"), 0);
  EXPECT_GE(CountEvents(v1::FALLBACK, "rank 1 step 3"), 1);
}

// The redirect is a field, not prose: the "ckpt-leader" trailer names the
// leader whatever the message says.
TEST(LeaderHintTest, TrailerNamesTheLeaderEvenWhenTheMessageDoesNot) {
  const std::string key = kLeaderMetadataKey, leader = "10.0.0.2:7000";
  std::multimap<grpc::string_ref, grpc::string_ref> trailers;
  trailers.emplace(key, leader);
  EXPECT_EQ(
      LeaderHint(grpc::Status(grpc::StatusCode::UNAVAILABLE, "not leader"),
                 trailers),
      leader);
  EXPECT_EQ(LeaderHint(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "not leader; leader is 10.0.0.9:7000"),
                       trailers),
            leader)
      << "the trailer wins over the text";
}

// A coordinator older than the trailer named the leader in its message
// only; clients keep following that for one release.
TEST(LeaderHintTest, MessageOfAnOlderCoordinatorStillNamesTheLeader) {
  const std::multimap<grpc::string_ref, grpc::string_ref> none;
  EXPECT_EQ(LeaderHint(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "not leader; leader is 10.0.0.3:7000"),
                       none),
            "10.0.0.3:7000");
  EXPECT_EQ(LeaderHint(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                    "not leader; no leader elected yet"),
                       none),
            "");
}

// A standby answers UNAVAILABLE with a readable message and the leader's
// address in the "ckpt-leader" trailer; a client given the standby first
// ends up on the leader.
TEST_F(ServerTest, StandbyNamesTheLeaderInATrailerAndTheClientFollowsIt) {
  Start();
  Leadership leadership;
  leadership.leading = [] { return false; };
  leadership.leader = [addr = Address()] { return addr; };
  auto standby = CoordinatorServer::StartStandby("127.0.0.1:0",
                                                 ServerSecurity{}, leadership);
  ASSERT_TRUE(standby.ok()) << standby.status();
  const std::string standby_addr =
      "127.0.0.1:" + std::to_string((*standby)->port());

  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(standby_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::GetClusterResponse cluster;
  grpc::Status s = stub->GetCluster(&ctx, v1::GetClusterRequest(), &cluster);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("not leader"), std::string::npos)
      << s.error_message();
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadataKey);
  ASSERT_NE(it, trailers.end()) << "no ckpt-leader trailer";
  EXPECT_EQ(std::string(it->second.data(), it->second.size()), Address());

  // The watch stream too (ckptrun reopens it at the named leader).
  auto watch = v1::CoordinatorWatch::NewStub(
      grpc::CreateChannel(standby_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext wctx;
  wctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::WatchJobRequest wreq;
  wreq.set_job("job");
  wreq.set_node_id("n1");
  auto reader = watch->WatchJob(&wctx, wreq);
  v1::JobView view;
  EXPECT_FALSE(reader->Read(&view));
  s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(LeaderHint(grpc::Status(s.error_code(), "not leader"), wctx),
            Address());

  auto client =
      CoordinatorClient::Create(standby_addr + "," + Address(), TlsFiles{});
  ASSERT_TRUE(client.ok()) << client.status();
  s = (*client)->Call(&CoordinatorClient::Stub::GetCluster,
                      v1::GetClusterRequest(), &cluster,
                      std::chrono::milliseconds(5000));
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ((*client)->current(), Address());
}

}  // namespace
}  // namespace ckpt::coordinator
