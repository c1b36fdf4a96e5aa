// Peer replicas through the Coordinator's own calls: replica
// targets in heartbeats, registration of domains and ports, REPLICATED
// reports and their refusals, and the soft state sent again to a new
// incarnation.
#include <fstream>

#include "coordinator/options.h"
#include "coordinator/replica_testing.h"

namespace ckpt::coordinator {
namespace {

TEST_F(ReplicaTest, HeartbeatNamesATargetInAnotherDomainUntilItDies) {
  auto hb = Heartbeat("n2", e2_);
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_TRUE(hb->has_replica_target());
  EXPECT_EQ(hb->replica_target().node_id(), "n3");
  EXPECT_EQ(hb->replica_target().host(), "n3");
  EXPECT_EQ(hb->replica_target().port(), kPortBase + 3);
  // Stable while membership holds.
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
  auto one = Heartbeat("n1", e1_);
  ASSERT_TRUE(one->has_replica_target());
  EXPECT_EQ(one->replica_target().node_id(), "n2");
  // Hosting nothing, n3 and s1 need no target.
  EXPECT_FALSE(Heartbeat("n3", e3_)->has_replica_target());
  EXPECT_FALSE(Heartbeat("s1", es_)->has_replica_target());
  EXPECT_EQ(Node("n2").replica_target(), "n3");
  EXPECT_EQ(Node("n2").domain(), "rack-b");
  EXPECT_EQ(Node("n2").replica_port(), kPortBase + 2);

  Silence({"n3"});  // the holder dies: n2 gets another one
  auto again = Heartbeat("n2", e2_);
  ASSERT_TRUE(again->has_replica_target());
  EXPECT_NE(again->replica_target().node_id(), "n3");
  EXPECT_NE(again->replica_target().node_id(), "n2");
}

TEST_F(ReplicaTest, RegistrationRefusesABadDomainOrPortNamingTheField) {
  std::string before = State();
  v1::RegisterNodeRequest req;
  req.set_node_id("n9");
  req.set_capacity(1);
  req.set_domain("rack\n7");
  auto r = coord_->RegisterNode(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("domain"), absl::string_view::npos)
      << r.status();
  req.set_domain(std::string(129, 'r'));
  r = coord_->RegisterNode(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("domain"), absl::string_view::npos)
      << r.status();
  req.set_domain("rack-7");
  req.set_replica_port(70000);
  r = coord_->RegisterNode(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("replica_port"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(State(), before);
}

TEST_F(ReplicaTest,
       BadReplicatedReportsAreRefusedNamingTheFieldAndChangeNothing) {
  ReportAll(12, v1::STAGED);
  const std::string before = State();
  struct Case {
    std::string field;
    absl::StatusCode code;
    std::string holder;
    std::string source;
    std::function<void(v1::ShardReport&)> tweak;
  };
  const std::vector<Case> cases = {
      {"checksum_digest", absl::StatusCode::kInvalidArgument, "n3", "n2",
       [](v1::ShardReport& r) { r.set_checksum_digest(0xdead); }},
      {"bytes", absl::StatusCode::kInvalidArgument, "n3", "n2",
       [](v1::ShardReport& r) { r.set_bytes(7); }},
      {"source_node", absl::StatusCode::kFailedPrecondition, "n3", "n1",
       nullptr},
      {"source_node", absl::StatusCode::kInvalidArgument, "n2", "n2", nullptr},
      {"source_node", absl::StatusCode::kInvalidArgument, "n3", "", nullptr},
      {"source_node", absl::StatusCode::kInvalidArgument, "n3", "../n2",
       nullptr},
      {"rank", absl::StatusCode::kInvalidArgument, "n3", "n2",
       [](v1::ShardReport& r) { r.set_rank(4); }},
      {"job", absl::StatusCode::kNotFound, "n3", "n2",
       [](v1::ShardReport& r) { r.set_job("other"); }},
      // Never staged: the source lives, its report may still come.
      {"step", absl::StatusCode::kUnavailable, "n3", "n2",
       [](v1::ShardReport& r) { r.set_step(13); }},
  };
  for (const Case& c : cases) {
    absl::Status s = Replicated(c.holder, 12, 2, c.source, c.tweak);
    EXPECT_EQ(s.code(), c.code) << c.field << ": " << s;
    EXPECT_EQ(s.message().substr(0, c.field.size() + 1), c.field + ":") << s;
    EXPECT_EQ(State(), before) << c.field;
  }
  // A fenced holder's whole call.
  absl::Status fenced = Replicated("n3", 12, 2, "n2", nullptr, e3_ + 100);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kFailedPrecondition) << fenced;
  EXPECT_EQ(State(), before);
  EXPECT_EQ(Memory().replicated_ranks(), 0u);
  // The same report, well formed, counts.
  ASSERT_TRUE(Replicated("n3", 12, 2, "n2").ok());
  EXPECT_EQ(Memory().replicated_ranks(), 1u);
}

// A holder may name the save by its staged digest or carry the digest of
// the bytes it holds; either matches the rank's STAGED report.
TEST_F(ReplicaTest, AReplicaMatchesItsSaveByEitherDigest) {
  ReportAll(12, v1::STAGED);
  EXPECT_TRUE(Replicated("n3", 12, 2, "n2", [](v1::ShardReport& r) {
                r.set_staged_digest(0);  // unset in the holder's terms
              }).ok());
  EXPECT_TRUE(Replicated("n3", 12, 3, "n2", [](v1::ShardReport& r) {
                r.set_staged_digest(r.checksum_digest());
                r.set_checksum_digest(0xfeed);  // device tensors, checksummed
              }).ok());
  EXPECT_EQ(Memory().replicated_ranks(), 2u);
}

TEST_F(ReplicaTest, AReplicaOfAnAbandonedGenerationIsDropped) {
  ReportAll(11, v1::STAGED);
  for (uint32_t r = 0; r < 3; ++r)  // step 12 never reached rank 3
    ASSERT_TRUE(
        Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, 12, r, v1::STAGED).ok());
  // A crash plans generation 1 (every rank restores 11 from memory): 12 is
  // of the timeline it abandoned.
  v1::ReportTrainerExitRequest exit;
  exit.set_node_id("n1");
  exit.set_epoch(e1_);
  exit.set_job("job");
  exit.set_rank(0);
  exit.set_term_signal(9);
  ASSERT_TRUE(coord_->ReportTrainerExit(exit).ok());
  ASSERT_EQ(Job().generation(), 1u);
  ASSERT_EQ(Job().restore_step(), 11u);
  const std::string before = State();
  absl::Status s = Replicated("n3", 12, 2, "n2",
                              [](v1::ShardReport& r) { r.set_generation(0); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message().substr(0, 11), "generation:") << s;
  EXPECT_EQ(State(), before);
  // The restored step itself is the new generation's too.
  EXPECT_TRUE(Replicated("n3", 11, 2, "n2", [](v1::ShardReport& r) {
                r.set_generation(0);
              }).ok());
}

// A holder keeps the two newest copies of a rank (replica_store.h): when
// n2 dies with rank 2's step 12 copied and rank 3's not yet, step 11 is
// still in memory for both ranks.
TEST_F(ReplicaTest, AHolderKeepsTheTwoNewestReplicasOfARank) {
  ReportAll(11, v1::STAGED);
  ReportAll(12, v1::STAGED);
  ASSERT_TRUE(Replicated("n3", 11, 2, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 11, 3, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 12, 2, "n2").ok());  // n3 keeps 11 of rank 2
  Silence({"n2"});
  ASSERT_TRUE(Job().has_restore_step());
  EXPECT_EQ(Job().restore_step(), 11u);
}

TEST_F(ReplicaTest, AThirdReplicaOfARankReplacesTheHoldersOldest) {
  for (uint64_t step : {11, 12, 13}) ReportAll(step, v1::STAGED);
  ASSERT_TRUE(Replicated("n3", 11, 2, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 11, 3, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 12, 2, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 13, 2, "n2").ok());  // n3 dropped 11 of rank 2
  Silence({"n2"});
  // 13 and 12 lack rank 3's replica, 11 rank 2's: no memory step; nothing
  // durable.
  EXPECT_FALSE(Job().has_restore_step());
}

TEST_F(ReplicaTest, ReplicasSentAgainToANewIncarnationCountAgain) {
  StageAndReplicate();
  Reopen();  // a restart (or a new leader): the soft state is gone
  EXPECT_EQ(Memory().replicated_ranks(), 0u);
  // The holder may send before the source does: retry, not refused.
  absl::Status early = Replicated("n3", 12, 2, "n2");
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable) << early;
  ReportAll(12, v1::STAGED);
  for (uint32_t r : {2u, 3u}) ASSERT_TRUE(Replicated("n3", 12, r, "n2").ok());
  Silence({"n2"});
  EXPECT_EQ(Job().restore_step(), 12u);
  EXPECT_EQ(OrderOf(*Heartbeat("s1", es_), v1::PREFETCH).sources(0).node_id(),
            "n3");
}

TEST_F(ReplicaTest, ANodeFetchingAPlansShardsHoldsNoReplicasUntilItIsDone) {
  StageAndReplicate();
  // n2 and n3 (n1's holder-to-be) die: the spare s1 takes n2's ranks and
  // fetches them (from the shared root), and is the only node left that
  // could hold n1's replicas.
  Silence({"n2", "n3"});
  auto spare = Heartbeat("s1", es_);
  ASSERT_TRUE(spare.ok()) << spare.status();
  const uint64_t prefetch = OrderOf(*spare, v1::PREFETCH).id();
  // While s1 fetches, n1's copies would compete with the fetch for the
  // link: no target yet.
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  EXPECT_FALSE(survivor->has_replica_target())
      << survivor->replica_target().DebugString();
  EXPECT_EQ(Node("n1").replica_target(), "");
  // s1 hosts ranks now: its own copies go to n1 meanwhile.
  EXPECT_EQ(spare->replica_target().node_id(), "n1");
  // The restarts acknowledged: s1 still fetches.
  ASSERT_TRUE(Heartbeat("s1", es_, {OrderOf(*spare, v1::RESTART).id()}).ok());
  EXPECT_FALSE(Heartbeat("n1", e1_)->has_replica_target());
  // Done fetching: s1 holds n1's replicas.
  ASSERT_TRUE(Heartbeat("s1", es_, {prefetch}).ok());
  EXPECT_EQ(Heartbeat("n1", e1_)->replica_target().node_id(), "s1");
}

// A heartbeat of `node` saying its target `holder` refused its copies.
absl::StatusOr<v1::HeartbeatResponse> RefusedBy(Coordinator& c,
                                                const std::string& node,
                                                uint64_t epoch,
                                                const std::string& holder,
                                                const std::string& reason) {
  v1::HeartbeatRequest req;
  req.set_node_id(node);
  req.set_epoch(epoch);
  req.mutable_replica_refused()->set_holder_node_id(holder);
  req.mutable_replica_refused()->set_reason(reason);
  return c.Heartbeat(req);
}

TEST_F(ReplicaTest, AHolderWithoutRoomIsReplacedInAnotherDomainUntilRestarted) {
  ASSERT_EQ(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
  // n1 names n3, which is not its target (n2): nothing moves.
  ASSERT_TRUE(RefusedBy(*coord_, "n1", e1_, "n3", "replica_memory_bytes").ok());
  EXPECT_EQ(Heartbeat("n1", e1_)->replica_target().node_id(), "n2");
  EXPECT_TRUE(EventsOf(v1::REPLICA_REFUSED).empty());

  auto hb = RefusedBy(*coord_, "n2", e2_, "n3",
                      "replica_memory_bytes: 8388608 more bytes do not fit");
  ASSERT_TRUE(hb.ok()) << hb.status();
  const std::string now = hb->replica_target().node_id();
  EXPECT_NE(now, "n3");
  EXPECT_NE(now, "n2");
  EXPECT_NE(Node(now).domain(), "rack-b") << "failure domains still hold";
  EXPECT_EQ(Node("n2").replica_target(), now);
  EXPECT_EQ(Heartbeat("n1", e1_)->replica_target().node_id(), "n2");
  // Said again (the node has not seen its new target yet): still news once.
  ASSERT_TRUE(RefusedBy(*coord_, "n2", e2_, "n3", "again").ok());
  EXPECT_EQ(Heartbeat("n2", e2_)->replica_target().node_id(), now);
  std::vector<v1::Event> refused = EventsOf(v1::REPLICA_REFUSED);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].node_id(), "n2");
  EXPECT_NE(refused[0].detail().find("n3 refused them (replica_memory_bytes"),
            std::string::npos)
      << refused[0].detail();
  EXPECT_NE(refused[0].detail().find("target now " + now), std::string::npos)
      << refused[0].detail();

  // n3 restarts (its memory is empty again): n2 may use it again.
  Silence({"n3"});
  e3_ = RegisterIn("n3", "rack-c", 1, 3);
  EXPECT_EQ(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
}

TEST_F(ReplicaTest, ABadRefusalIsRefusedNamingTheFieldAndChangesNothing) {
  const std::string before = State();
  struct Case {
    std::string holder, reason, field;
  };
  for (const Case& c :
       {Case{"", "x", "replica_refused.holder_node_id"},
        Case{"n\n3", "x", "replica_refused.holder_node_id"},
        Case{"n2", "x", "replica_refused.holder_node_id"},
        Case{"n3", "bad\nreason", "replica_refused.reason"},
        Case{"n3", std::string(2000, 'r'), "replica_refused.reason"}}) {
    auto hb = RefusedBy(*coord_, "n2", e2_, c.holder, c.reason);
    ASSERT_EQ(hb.status().code(), absl::StatusCode::kInvalidArgument)
        << c.holder;
    EXPECT_NE(hb.status().message().find(c.field), absl::string_view::npos)
        << hb.status();
  }
  EXPECT_EQ(State(), before);
  EXPECT_EQ(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
}

TEST_F(ReplicaTest, AReplacementReplicatesTheShardItRestoredOfTheOldTimeline) {
  // Saved in generation 0; n2 lost; s1 restores step 12 in generation 1
  // and sends copies of it, still tagged with generation 0.
  StageAndReplicate();
  Silence({"n2"});
  ASSERT_EQ(Job().generation(), 1u);
  ASSERT_EQ(Job().restore_step(), 12u);
  auto gen0 = [](v1::ShardReport& r) { r.set_generation(0); };
  absl::Status s = Replicated("n1", 12, 2, "s1", gen0);
  EXPECT_TRUE(s.ok()) << s;
  // A step of generation 0 after the restore step is still abandoned.
  s = Replicated("n1", 13, 2, "s1", gen0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message().substr(0, 11), "generation:") << s;
}

TEST(WaitForPrefetchOptionTest, ComesFromTheFlagOrTheConfigFile) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"ckpt-coordinator",   "--listen",
                                     "127.0.0.1:0",        "--state",
                                     "/nonexistent/state", "--insecure"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    std::string help;
    return ParseCoordinatorOptions(static_cast<int>(argv.size()), argv.data(),
                                   &help);
  };
  auto o = parse({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->coordinator.start_trainers_with_prefetch) << "the default";
  o = parse({"--wait-for-prefetch"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->coordinator.start_trainers_with_prefetch);
  ckpt::testing::TempDir dir;
  const std::string config = dir.path() + "/coordinator.toml";
  std::ofstream(config) << "wait_for_prefetch = true\n";
  o = parse({"--config", config});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->coordinator.start_trainers_with_prefetch);
}

}  // namespace
}  // namespace ckpt::coordinator
