// Cordoning in the coordinator (coordinator_cordon.cc, cordon_policy.h), on
// a fake clock: an operator's cordon moves a node's ranks to a spare and
// survives a restart; repeated crashes on one node within the window
// cordon it, but only when a spare can take its ranks; refusals name the
// field and change nothing.
#include "coordinator/coordinator_testing.h"
#include "coordinator/cordon_policy.h"

namespace ckpt::coordinator {
namespace {

TEST(IncidentLogTest, CountsOneIncidentPerGenerationWithinTheWindow) {
  const CordonPolicy p{/*after=*/3, /*window_s=*/100};
  IncidentLog log;
  EXPECT_EQ(log.Add(p, 0, "job", 0), 1);
  EXPECT_EQ(log.Add(p, 10, "job", 0), 1);  // the same generation: once
  EXPECT_EQ(log.Add(p, 20, "other", 0), 2);
  EXPECT_EQ(log.Add(p, 30'000, "job", 1), 3);
  EXPECT_TRUE(IncidentLog::Due(p, 3));
  EXPECT_FALSE(IncidentLog::Due(p, 2));
  // 100 s after the first two, only the last one and this one count.
  EXPECT_EQ(log.Add(p, 100'021, "job", 2), 2);
  EXPECT_FALSE(IncidentLog::Due(CordonPolicy{0, 100}, 50));  // 0: never
}

class CordonTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    cordon_ = CordonPolicy{/*after=*/2, /*window_s=*/600};
    heartbeat_timeout_ms_ = 3'600'000;  // nodes stay alive across the window
    TwoNodeTest::SetUp();
  }
  // A crash of the trainer of `rank` on `node` in the job's generation.
  absl::StatusOr<v1::ReportTrainerExitResponse> Crash(const std::string& node,
                                                      uint32_t rank) {
    v1::ReportTrainerExitRequest exit =
        TrainerExit(node, node == "n1" ? e1_ : e2_, rank, 9);
    exit.set_generation(Job().generation());
    return coord_->ReportTrainerExit(exit);
  }
  absl::StatusOr<v1::CordonResponse> Cordon(const std::string& node,
                                            const std::string& reason) {
    v1::CordonRequest req;
    req.set_node_id(node);
    req.set_reason(reason);
    return coord_->Cordon(req);
  }
  absl::StatusOr<v1::UncordonResponse> Uncordon(const std::string& node) {
    v1::UncordonRequest req;
    req.set_node_id(node);
    return coord_->Uncordon(req);
  }
};

TEST_F(CordonTest, OperatorCordonMovesRanksToASpareAndSurvivesARestart) {
  auto r = Cordon("n2", "ECC errors on GPU 3");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->changed());
  v1::JobRecord job = Job();
  EXPECT_EQ(job.rank_node(0), "n1");
  EXPECT_EQ(job.rank_node(2), "s1");
  EXPECT_EQ(job.rank_node(3), "s1");
  EXPECT_EQ(job.generation(), 1u);
  auto cordoned = EventsOf(v1::CORDONED);
  ASSERT_EQ(cordoned.size(), 1u);
  EXPECT_EQ(cordoned[0].node_id(), "n2");
  EXPECT_EQ(cordoned[0].cordon().reason(), "ECC errors on GPU 3");
  EXPECT_EQ(cordoned[0].cordon().by(), "operator");

  Reopen();  // a coordinator restart keeps the mark
  EXPECT_TRUE(Node("n2").cordoned());
  EXPECT_EQ(Node("n2").cordon_reason(), "ECC errors on GPU 3");
  auto again = Cordon("n2", "another reason");  // already: a no-op
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->changed());
  EXPECT_EQ(again->reason(), "ECC errors on GPU 3");
  EXPECT_EQ(Job().generation(), 1u);

  // No new job is placed there (n1 is full, s1 is a spare).
  v1::RegisterJobRequest two;
  two.set_job("two");
  two.set_world_size(2);
  auto placed = coord_->RegisterJob(two);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kFailedPrecondition)
      << placed.status();

  auto un = Uncordon("n2");
  ASSERT_TRUE(un.ok()) << un.status();
  EXPECT_TRUE(un->changed());
  EXPECT_TRUE(un->spare());  // it hosts nothing: it takes a spare's place
  EXPECT_FALSE(Node("n2").cordoned());
  EXPECT_EQ(EventsOf(v1::UNCORDONED).size(), 1u);
  auto twice = Uncordon("n2");
  ASSERT_TRUE(twice.ok());
  EXPECT_FALSE(twice->changed());
}

TEST_F(CordonTest, ANodeRegisteringAgainStaysCordoned) {
  ASSERT_TRUE(Cordon("n2", "bad DIMM").ok());
  now_ms_ += heartbeat_timeout_ms_ + 1;
  ASSERT_TRUE(coord_->Tick().ok());  // every node timed out
  ASSERT_EQ(Node("n2").health(), v1::DEAD);
  e2_ = Register("n2", 2, /*spare=*/true);  // its ckptd restarted
  EXPECT_TRUE(Node("n2").cordoned());
  EXPECT_EQ(Node("n2").cordon_reason(), "bad DIMM");
  EXPECT_EQ(Job().rank_node(2), "s1");  // no plan put ranks back on it
}

TEST_F(CordonTest, RefusalsNameTheFieldAndChangeNothing) {
  const size_t events = coord_->Events({}).events_size();
  auto unknown = Cordon("zz", "bad");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("node_id: \"zz\""),
            std::string::npos)
      << unknown.status();
  for (const std::string& reason :
       {std::string(), std::string("a\nb"), std::string(513, 'x')}) {
    auto bad = Cordon("n2", reason);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.status().message().rfind("reason: ", 0), 0u) << bad.status();
  }
  auto bad_node = Cordon("../n2", "bad");
  EXPECT_EQ(bad_node.status().message().rfind("node_id: ", 0), 0u)
      << bad_node.status();
  auto un = Uncordon("");
  EXPECT_EQ(un.status().message().rfind("node_id: ", 0), 0u) << un.status();
  EXPECT_EQ(Uncordon("zz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(Node("n2").cordoned());
  EXPECT_EQ(Job().generation(), 0u);
  EXPECT_EQ(coord_->Events({}).events_size(), static_cast<int>(events));
}

TEST_F(CordonTest, TwoCrashesOnANodeWithinTheWindowCordonItAndMoveItsRanks) {
  ASSERT_TRUE(Crash("n2", 3).ok());  // one incident: a restart in place
  EXPECT_EQ(Job().rank_node(3), "n2");
  EXPECT_FALSE(Node("n2").cordoned());
  ASSERT_TRUE(Crash("n1", 0).ok());  // another node's: not n2's count
  now_ms_ += 599'000;
  ASSERT_TRUE(Crash("n2", 2).ok());
  v1::NodeRecord n2 = Node("n2");
  EXPECT_TRUE(n2.cordoned());
  EXPECT_NE(n2.cordon_reason().find("2 hangs or trainer crashes within 600 s"),
            std::string::npos)
      << n2.cordon_reason();
  const v1::JobRecord job = Job();
  EXPECT_EQ(job.rank_node(2), "s1");
  EXPECT_EQ(job.rank_node(3), "s1");
  EXPECT_EQ(job.rank_node(0), "n1");
  EXPECT_EQ(job.generation(), 3u);  // one plan per incident, none extra
  auto cordoned = EventsOf(v1::CORDONED);
  ASSERT_EQ(cordoned.size(), 1u);
  EXPECT_EQ(cordoned[0].cordon().by(), "incidents");
  EXPECT_FALSE(Node("n1").cordoned());
}

TEST_F(CordonTest, CrashesFurtherApartThanTheWindowDoNotCordon) {
  // A window shorter than the plans' acknowledgement deadline (600 s):
  // nobody acknowledges here.
  cordon_.window_s = 100;
  Reopen();
  ASSERT_TRUE(Crash("n2", 3).ok());
  now_ms_ += 100'001;
  ASSERT_TRUE(Crash("n2", 3).ok());
  EXPECT_FALSE(Node("n2").cordoned());
  EXPECT_EQ(Job().rank_node(3), "n2");
}

TEST_F(CordonTest, WithoutASpareNothingIsCordonedAndAnEventSaysWhy) {
  ASSERT_TRUE(Cordon("s1", "spare under repair").ok());  // no spare left
  ASSERT_TRUE(Crash("n2", 3).ok());
  ASSERT_TRUE(Crash("n2", 3).ok());
  EXPECT_FALSE(Node("n2").cordoned());
  EXPECT_EQ(Job().rank_node(3), "n2");
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);  // restarted in place
  auto skipped = EventsOf(v1::EVICTION_SKIPPED);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].node_id(), "n2");
  EXPECT_NE(skipped[0].detail().find("no healthy spare has room for its 2 "
                                     "ranks"),
            std::string::npos)
      << skipped[0].detail();
  // The spare comes back: the next crash cordons n2 and its ranks move.
  ASSERT_TRUE(Uncordon("s1").ok());
  ASSERT_TRUE(Crash("n2", 3).ok());
  EXPECT_TRUE(Node("n2").cordoned());
  EXPECT_EQ(Job().rank_node(3), "s1");
}

TEST_F(CordonTest, AnOperatorCordonWithoutASpareLeavesTheRanksWaiting) {
  ASSERT_TRUE(Cordon("s1", "spare under repair").ok());
  ASSERT_TRUE(Cordon("n1", "bad NIC").ok());
  v1::JobRecord job = Job();
  EXPECT_EQ(job.plan_state(), v1::PLAN_WAITING_FOR_NODE);
  EXPECT_EQ(job.lost_ranks_size(), 2);
  // Uncordoning the spare ends the wait: n1's ranks go there.
  ASSERT_TRUE(Uncordon("s1").ok());
  job = Job();
  EXPECT_EQ(job.plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(job.rank_node(0), "s1");
  EXPECT_EQ(job.rank_node(1), "s1");
}

}  // namespace
}  // namespace ckpt::coordinator
