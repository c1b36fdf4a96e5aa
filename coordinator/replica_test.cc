// Peer replicas (issue 19) through the Coordinator's own calls: replica
// targets in heartbeats, REPLICATED reports and their refusals, and plans
// that restore a lost node's ranks from a live holder's memory.
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "coordinator/coordinator_testing.h"
#include "coordinator/options.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

using ckpt::testing::SampleValue;
using Labels = std::map<std::string, std::string>;

constexpr uint32_t kPortBase = 7100;

// n1 (rack-a) hosts ranks 0-1, n2 (rack-b) ranks 2-3, n3 (rack-c) hosts
// nothing but holds replicas, s1 (rack-d) is the spare. Placement: n1's
// replicas go to n2, n2's to n3.
class ReplicaTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    e1_ = RegisterIn("n1", "rack-a", 2, 1);
    e2_ = RegisterIn("n2", "rack-b", 2, 2);
    e3_ = RegisterIn("n3", "rack-c", 1, 3);
    es_ = RegisterIn("s1", "rack-d", 2, 4, /*spare=*/true);
    RegisterJob("job", 4);
  }
  uint64_t RegisterIn(const std::string& node, const std::string& domain,
                      uint32_t capacity, uint32_t port_offset,
                      bool spare = false) {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_address(node + ":1");
    req.set_capacity(capacity);
    req.set_spare(spare);
    req.set_domain(domain);
    req.set_replica_port(kPortBase + port_offset);
    auto r = coord_->RegisterNode(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->epoch() : 0;
  }
  uint64_t EpochOf(const std::string& n) {
    return n == "n1" ? e1_ : n == "n2" ? e2_ : n == "n3" ? e3_ : es_;
  }
  void ReportAll(uint64_t step, v1::ShardState state) {
    for (uint32_t r = 0; r < 4; ++r) {
      const std::string node = r < 2 ? "n1" : "n2";
      auto s = Report(node, EpochOf(node), step, r, state);
      ASSERT_TRUE(s.ok()) << s.status();
    }
  }
  // A REPLICATED report of `holder` for `source`'s rank, as the fixture's
  // STAGED reports describe it; `tweak` changes it before it is sent.
  absl::Status Replicated(
      const std::string& holder, uint64_t step, uint32_t rank,
      const std::string& source,
      const std::function<void(v1::ShardReport&)>& tweak = nullptr,
      std::optional<uint64_t> epoch = std::nullopt) {
    v1::ReportShardsRequest req;
    req.set_node_id(holder);
    req.set_epoch(epoch.value_or(EpochOf(holder)));
    v1::ShardReport& r = *req.add_reports();
    r.set_job("job");
    r.set_step(step);
    r.set_rank(rank);
    r.set_state(v1::REPLICATED);
    r.set_bytes(1000 + rank);
    r.set_checksum_digest(0xabc0 + rank);
    r.set_source_node(source);
    if (tweak) tweak(r);
    auto resp = coord_->ReportShards(req);
    if (!resp.ok()) return resp.status();
    const v1::ReportResult& res = resp->results(0);
    return absl::Status(static_cast<absl::StatusCode>(res.code()),
                        res.message());
  }
  // Everyone but `silent` heartbeats once; a full timeout later the
  // failure detector's tick finds `silent` dead (and its plan is durable
  // when Tick returns).
  void Silence(const std::vector<std::string>& silent) {
    for (int beat = 0; beat < 2; ++beat) {
      for (const char* n : {"n1", "n2", "n3", "s1"}) {
        if (std::find(silent.begin(), silent.end(), n) != silent.end() ||
            Node(n).health() != v1::ALIVE)
          continue;
        ASSERT_TRUE(Heartbeat(n, EpochOf(n)).ok()) << n;
      }
      now_ms_ += 2000;
    }
    ASSERT_TRUE(coord_->Tick().ok());
    for (const std::string& n : silent)
      ASSERT_EQ(Node(n).health(), v1::DEAD) << n;
  }
  // Step 10 durable everywhere (last good), step 12 staged everywhere,
  // n2's ranks of step 12 replicated on n3.
  void StageAndReplicate() {
    ReportAll(10, v1::STAGED);
    ReportAll(10, v1::DURABLE);
    ReportAll(12, v1::STAGED);
    ASSERT_EQ(Job().last_good_step(), 10u);
    for (uint32_t r : {2u, 3u}) {
      absl::Status s = Replicated("n3", 12, r, "n2");
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  v1::JobMemory Memory() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (const auto& m : c.memory())
      if (m.job() == "job") return m;
    ADD_FAILURE() << "no memory entry for job";
    return {};
  }
  std::string State() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (auto& n : *c.mutable_nodes()) n.clear_ms_since_heartbeat();
    return c.SerializeAsString();
  }
  v1::Order OrderOf(const v1::HeartbeatResponse& hb, v1::OrderKind kind) {
    for (const auto& o : hb.orders())
      if (o.kind() == kind) return o;
    ADD_FAILURE() << "no " << v1::OrderKind_Name(kind) << " order in "
                  << hb.DebugString();
    return {};
  }
  uint64_t e1_ = 0, e2_ = 0, e3_ = 0, es_ = 0;
};

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

TEST_F(ReplicaTest, AReplicaOfAnAbandonedGenerationIsDropped) {
  ReportAll(12, v1::STAGED);
  // A crash plans generation 1 (every rank restores 12 from memory).
  v1::ReportTrainerExitRequest exit;
  exit.set_node_id("n1");
  exit.set_epoch(e1_);
  exit.set_job("job");
  exit.set_rank(0);
  exit.set_term_signal(9);
  ASSERT_TRUE(coord_->ReportTrainerExit(exit).ok());
  ASSERT_EQ(Job().generation(), 1u);
  const std::string before = State();
  absl::Status s = Replicated("n3", 12, 2, "n2",
                              [](v1::ShardReport& r) { r.set_generation(0); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message().substr(0, 11), "generation:") << s;
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(Replicated("n3", 12, 2, "n2", [](v1::ShardReport& r) {
                r.set_generation(1);
              }).ok());
}

TEST_F(ReplicaTest, NodeLossRestoresTheNewerMemoryStepFromTheReplicaHolder) {
  StageAndReplicate();
  EXPECT_EQ(Memory().memory_step(), 12u);
  EXPECT_EQ(Memory().replicated_ranks(), 2u);
  Silence({"n2"});
  v1::JobRecord j = Job();
  EXPECT_EQ(j.rank_node(2), "s1");
  ASSERT_TRUE(j.has_restore_step());
  EXPECT_EQ(j.restore_step(), 12u);  // storage alone: 10
  auto spare = Heartbeat("s1", es_);
  ASSERT_TRUE(spare.ok()) << spare.status();
  v1::Order prefetch = OrderOf(*spare, v1::PREFETCH);
  EXPECT_EQ(prefetch.step(), 12u);
  ASSERT_EQ(prefetch.ranks_size(), 2);
  ASSERT_EQ(prefetch.sources_size(), 2);
  ASSERT_EQ(prefetch.shard_keys_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(prefetch.sources(i).node_id(), "n3");
    EXPECT_EQ(prefetch.sources(i).host(), "n3");
    EXPECT_EQ(prefetch.sources(i).port(), kPortBase + 3);
    EXPECT_TRUE(prefetch.sources(i).replica());
  }
  EXPECT_EQ(OrderOf(*spare, v1::RESTART).step(), 12u);
  // The survivor restores 12 from its own memory and keeps it.
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_EQ(survivor->orders_size(), 1);
  EXPECT_EQ(survivor->orders(0).step(), 12u);
  ASSERT_EQ(survivor->assignments_size(), 1);
  EXPECT_EQ(survivor->assignments(0).restore_step(), 12u);
  EXPECT_EQ(Job().last_good_step(), 10u);  // last good is still storage's

  std::vector<v1::Event> where = EventsOf(v1::RESTORE_SOURCES);
  ASSERT_EQ(where.size(), 1u);
  const v1::RestoreSources& rs = where[0].restore();
  EXPECT_EQ(rs.step(), 12u);
  EXPECT_TRUE(rs.from_memory());
  EXPECT_EQ(rs.durable_step(), 10u);
  EXPECT_EQ(rs.steps_lost(), 0u);
  EXPECT_EQ(rs.steps_lost_durable(), 2u);
  ASSERT_EQ(rs.ranks_size(), 2);
  EXPECT_EQ(rs.ranks(0).rank(), 2u);
  EXPECT_EQ(rs.ranks(0).node_id(), "n3");
  EXPECT_EQ(rs.ranks(0).copy(), "replica");
  EXPECT_NE(where[0].detail().find("rank 2 from replica on n3"),
            std::string::npos)
      << where[0].detail();
}

TEST_F(ReplicaTest, MetricsCountReplicatedRanksAndWhereAPlanFetchedFrom) {
  StageAndReplicate();
  auto text = [&] {
    return prometheus::TextSerializer().Serialize(
        coord_->options().metrics->Collect());
  };
  const Labels job{{"ckpt_job", "job"}};
  std::string t = text();
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_replicated_ranks", job), 2.0) << t;
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_memory_restorable_step", job),
            12.0)
      << t;
  Silence({"n2"});
  t = text();
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_restore_sources_total",
                        {{"ckpt_job", "job"}, {"copy", "replica"}}),
            2.0)
      << t;
}

TEST_F(ReplicaTest, WithoutReplicasTheSameLossRestoresTheDurableStep) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(12, v1::STAGED);
  Silence({"n2"});
  EXPECT_EQ(Job().restore_step(), 10u);
}

TEST_F(ReplicaTest, NodeAndItsHolderLostTogetherFallBackToStorage) {
  StageAndReplicate();
  Silence({"n2", "n3"});
  EXPECT_EQ(Job().restore_step(), 10u);
  EXPECT_EQ(Memory().replicated_ranks(), 0u);  // died with n3
  v1::Order prefetch = OrderOf(*Heartbeat("s1", es_), v1::PREFETCH);
  EXPECT_EQ(prefetch.step(), 10u);
  ASSERT_EQ(prefetch.sources_size(), 2);
  EXPECT_EQ(prefetch.sources(0).host(), "");  // the shared root
  EXPECT_EQ(prefetch.shard_keys(0), "job/step-10/rank-2");
  std::vector<v1::Event> where = EventsOf(v1::RESTORE_SOURCES);
  ASSERT_EQ(where.size(), 1u);
  EXPECT_FALSE(where[0].restore().from_memory());
  EXPECT_EQ(where[0].restore().ranks(0).copy(), "storage");
  EXPECT_EQ(where[0].restore().steps_lost(), 2u);
}

TEST_F(ReplicaTest, AHolderThatDiedFirstTakesItsReplicasWithIt) {
  StageAndReplicate();
  Silence({"n3"});
  EXPECT_EQ(Memory().replicated_ranks(), 0u);
  // 12 is still in its hosts' memory, but n2's copy is its only one.
  EXPECT_EQ(Memory().memory_step(), 12u);
  EXPECT_NE(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
  Silence({"n2"});
  EXPECT_EQ(Job().restore_step(), 10u);
}

TEST_F(ReplicaTest, ACordonedNodeServesItsOwnSlotToTheRanksThatLeftIt) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(12, v1::STAGED);  // no replica: n2's memory is the only copy
  v1::CordonRequest cordon;
  cordon.set_node_id("n2");
  cordon.set_reason("ECC errors");
  ASSERT_TRUE(coord_->Cordon(cordon).ok());
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().restore_step(), 12u);
  v1::Order prefetch = OrderOf(*Heartbeat("s1", es_), v1::PREFETCH);
  ASSERT_EQ(prefetch.sources_size(), 2);
  EXPECT_EQ(prefetch.sources(0).node_id(), "n2");
  EXPECT_FALSE(prefetch.sources(0).replica());
  EXPECT_EQ(EventsOf(v1::RESTORE_SOURCES)[0].restore().ranks(0).copy(),
            "own slot");
}

TEST_F(ReplicaTest, ANewerReplicaOfARankReplacesTheHoldersOlderOne) {
  ReportAll(11, v1::STAGED);
  ReportAll(12, v1::STAGED);
  ASSERT_TRUE(Replicated("n3", 11, 2, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 11, 3, "n2").ok());
  ASSERT_TRUE(Replicated("n3", 12, 2, "n2").ok());  // n3 dropped 11 of rank 2
  Silence({"n2"});
  // 12 lacks rank 3's replica, 11 rank 2's: no memory step; nothing durable.
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

TEST_F(ReplicaTest, TrainersStartOnceRestartsAreAckedWhilePrefetchRuns) {
  StageAndReplicate();
  Silence({"n2"});
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());
  auto spare = Heartbeat("s1", es_);
  auto survivor = Heartbeat("n1", e1_);
  const uint64_t prefetch = OrderOf(*spare, v1::PREFETCH).id();
  ASSERT_TRUE(Heartbeat("s1", es_, {OrderOf(*spare, v1::RESTART).id()}).ok());
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());  // n1's
  ASSERT_TRUE(Heartbeat("n1", e1_, {survivor->orders(0).id()}).ok());
  v1::JobView view = coord_->View("job", "s1");
  EXPECT_TRUE(view.trainers_may_start());
  EXPECT_EQ(view.plan_state(), v1::PLAN_ORDERED);  // the prefetch still counts
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  ASSERT_TRUE(Heartbeat("s1", es_, {prefetch}).ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ACKNOWLEDGED);
}

TEST_F(ReplicaTest, WithoutEarlyStartTrainersWaitForEveryAcknowledgement) {
  start_trainers_with_prefetch_ = false;
  Reopen();
  StageAndReplicate();
  Silence({"n2"});
  auto spare = Heartbeat("s1", es_);
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_TRUE(Heartbeat("s1", es_, {OrderOf(*spare, v1::RESTART).id()}).ok());
  ASSERT_TRUE(Heartbeat("n1", e1_, {survivor->orders(0).id()}).ok());
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());
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
