// Hang detection in the coordinator, on a fake clock: progress reports
// ride on heartbeats; a rank past the model's timeout makes a
// HANG_DETECTED event naming the stuck rank, a stack request to its node,
// and a plan that restarts every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

struct BeatSpec {
  uint32_t rank;
  uint64_t step;
  uint64_t ms_since_advance;
  uint32_t p99_ms = 1000;
  uint64_t pause_ms = 0;  // > 0: a pause declared ms_since_pause ago
  uint64_t ms_since_pause = 0;
  uint32_t compute_ms = 0;
};

class HangTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    hang_ = HangPolicy{/*min_s=*/60, /*factor=*/10, /*first_step_s=*/600};
    heartbeat_timeout_ms_ = 3'600'000;  // the nodes live; ranks may hang
    TwoNodeTest::SetUp();
  }
  absl::StatusOr<v1::HeartbeatResponse> Beats(
      const std::string& node, const std::vector<BeatSpec>& beats) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_epoch(node == "n1" ? e1_ : e2_);
    for (const BeatSpec& b : beats) {
      v1::RankProgress* p = req.add_progress();
      p->set_job("job");
      p->set_rank(b.rank);
      p->set_has_step(true);
      p->set_step(b.step);
      p->set_ms_since_advance(b.ms_since_advance);
      p->set_step_ms_p99(b.p99_ms);
      p->set_step_samples(100);
      p->set_compute_ms(b.compute_ms);
      if (b.pause_ms > 0) {
        p->set_has_pause(true);
        p->set_pause_ms(b.pause_ms);
        p->set_ms_since_pause(b.ms_since_pause);
        p->set_pause_reason("evaluation");
      }
    }
    return coord_->Heartbeat(req);
  }
  // Every rank at `step`, last advanced `ago` ms before now.
  void AllAt(uint64_t step, uint64_t ago) {
    ASSERT_TRUE(Beats("n1", {{0, step, ago}, {1, step, ago}}).ok());
    ASSERT_TRUE(Beats("n2", {{2, step, ago}, {3, step, ago}}).ok());
  }
  std::vector<v1::Event> Hangs() {
    std::vector<v1::Event> out;
    v1::EventsResponse events = coord_->Events({});
    for (const auto& e : events.events())
      if (e.kind() == v1::HANG_DETECTED) out.push_back(e);
    return out;
  }
};

TEST_F(HangTest, ASlowFirstStepIsNoHangUntilTheFirstStepTimeout) {
  AllAt(5, 0);  // the watch of generation 0 starts now
  const int64_t start = now_ms_;
  // The trainers take 9 minutes for their first step: no report advances.
  for (int64_t t = 60'000; t <= 590'000; t += 60'000) {
    now_ms_ = start + t;
    AllAt(5, t);
  }
  EXPECT_TRUE(Hangs().empty());
  now_ms_ = start + 600'500;
  AllAt(5, 600'500);
  auto hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_TRUE(hangs[0].hang().first_step());
  EXPECT_DOUBLE_EQ(hangs[0].hang().timeout_s(), 600);
}

TEST_F(HangTest, TheRankBehindIsNamedNotTheRanksWaitingForIt) {
  AllAt(40, 0);
  now_ms_ += 2'000;
  AllAt(41, 0);  // advanced after the start: out of the first step
  const uint64_t generation = Job().generation();
  now_ms_ += 30'000;
  // Rank 2 stopped at 41; the others reached 42 and wait in a collective.
  ASSERT_TRUE(Beats("n1", {{0, 42, 29'000}, {1, 42, 29'000}}).ok());
  ASSERT_TRUE(Beats("n2", {{2, 41, 30'000}, {3, 42, 29'000}}).ok());
  EXPECT_TRUE(Hangs().empty());  // 30 s < the 60 s floor
  now_ms_ += 31'000;
  ASSERT_TRUE(Beats("n1", {{0, 42, 60'000}, {1, 42, 60'000}}).ok());
  ASSERT_TRUE(Beats("n2", {{2, 41, 61'000}, {3, 42, 60'000}}).ok());
  auto hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  const v1::Hang& h = hangs[0].hang();
  ASSERT_EQ(h.ranks_size(), 1);
  EXPECT_EQ(h.ranks(0), 2u);
  EXPECT_EQ(h.step(), 41u);
  EXPECT_DOUBLE_EQ(h.timeout_s(), 60);
  EXPECT_EQ(h.generation(), generation);
  EXPECT_EQ(hangs[0].node_id(), "n2");
  EXPECT_NE(h.stacks().find("ckptctl stacks --job job"), std::string::npos);
  // Every rank restarts (a new generation), and only n2 captures stacks.
  // A heartbeat does not wait for its batch, and views show durable
  // state only: wait for the group commit (bounded, not timed).
  for (int i = 0;
       i < 1000 && !coord_->View("job", "n2").has_capture_stacks_generation();
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  v1::JobRecord j = Job();
  EXPECT_EQ(j.generation(), generation + 1);
  EXPECT_EQ(j.plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(j.stack_request().generation(), generation);
  EXPECT_TRUE(coord_->View("job", "n2").has_capture_stacks_generation());
  EXPECT_EQ(coord_->View("job", "n2").capture_stacks_generation(), generation);
  EXPECT_FALSE(coord_->View("job", "n1").has_capture_stacks_generation());
  EXPECT_TRUE(HasEvent(v1::PLAN_MADE));
}

TEST_F(HangTest, ADeclaredPauseExtendsTheDeadlineOnce) {
  AllAt(49, 0);
  now_ms_ += 1'000;
  AllAt(50, 0);
  // Evaluation declared for 5 minutes right after step 50.
  for (int64_t t = 30'000; t <= 350'000; t += 40'000) {
    now_ms_ += 40'000;
    ASSERT_TRUE(Beats("n1", {{0, 50, 40'000 + (uint64_t)t - 30'000, 1000,
                              300'000, 40'000 + (uint64_t)t - 30'000},
                             {1, 50, 0}})
                    .ok());
    ASSERT_TRUE(Beats("n2", {{2, 50, 0}, {3, 50, 0}}).ok());
  }
  EXPECT_TRUE(Hangs().empty());  // 330 s silent, pause 300 s + 60 s
  now_ms_ += 40'000;
  ASSERT_TRUE(
      Beats("n1", {{0, 50, 370'000, 1000, 300'000, 370'000}, {1, 50, 0}}).ok());
  auto hangs = Hangs();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].hang().ranks(0), 0u);
  EXPECT_EQ(hangs[0].hang().pause_reason(), "evaluation");
}

TEST_F(HangTest, FinishedRanksAndJobsWithoutReportsAreNotWatched) {
  now_ms_ += 1'000'000;
  ASSERT_TRUE(Heartbeat("n1", e1_).ok());
  EXPECT_TRUE(Hangs().empty());  // no progress reports at all
  AllAt(7, 0);
  now_ms_ += 1'000;
  AllAt(8, 0);
  for (uint32_t r = 0; r < 4; ++r)
    ASSERT_TRUE(coord_
                    ->ReportTrainerExit(TrainerExit(r < 2 ? "n1" : "n2",
                                                    r < 2 ? e1_ : e2_, r, 0))
                    .ok());
  now_ms_ += 1'000'000;
  AllAt(8, 1'000'000);
  EXPECT_TRUE(Hangs().empty());
}

TEST_F(HangTest, ReportsOfRanksTheNodeDoesNotHostAreIgnored) {
  AllAt(3, 0);
  now_ms_ += 1'000;
  AllAt(4, 0);
  now_ms_ += 30'000;  // n2's ranks: silent for 30 s, within the 60 s floor
  // n1 claims rank 2 is stuck for 61 s: it is n2's.
  ASSERT_TRUE(Beats("n1", {{0, 4, 0}, {1, 4, 0}, {2, 1, 61'000}}).ok());
  ASSERT_TRUE(Beats("n2", {{2, 4, 0}, {3, 4, 0}}).ok());
  EXPECT_TRUE(Hangs().empty());
}

TEST_F(HangTest, ASlowRankIsNamedAStragglerAfterThreeWindowsAndNoOtherRank) {
  auto beat = [&](uint64_t step) {
    // Rank 3 computes 3x longer than the others; all advance.
    ASSERT_TRUE(Beats("n1", {{0, step, 0, 1000, 0, 0, 100},
                             {1, step, 0, 1000, 0, 0, 110}})
                    .ok());
    ASSERT_TRUE(Beats("n2", {{2, step, 0, 1000, 0, 0, 105},
                             {3, step, 0, 1000, 0, 0, 300}})
                    .ok());
  };
  auto stragglers = [&] {
    std::vector<v1::Event> out;
    v1::EventsResponse events = coord_->Events({});
    for (const auto& e : events.events())
      if (e.kind() == v1::STRAGGLER) out.push_back(e);
    return out;
  };
  beat(1);  // the watch starts (a window judged before n2 reported)
  for (uint64_t step = 2; step <= 4; ++step) {
    EXPECT_TRUE(stragglers().empty()) << "window " << step - 1;
    now_ms_ += 10'000;
    beat(step);
  }
  auto named = stragglers();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].straggler().rank(), 3u);
  EXPECT_EQ(named[0].node_id(), "n2");
  EXPECT_EQ(named[0].straggler().median_ms(), 105u);
  EXPECT_TRUE(named[0].straggler().compute());
  now_ms_ += 10'000;
  beat(5);
  EXPECT_EQ(stragglers().size(), 1u);  // named once, not every window
  EXPECT_TRUE(Hangs().empty());
}

// --evict-stragglers: a straggler's node is replaced by a spare, and never
// when no spare can take its ranks.
class EvictStragglersTest : public HangTest {
 protected:
  void SetUp() override {
    evict_stragglers_ = true;
    HangTest::SetUp();
  }
  // Rank 3 (on n2) computes 3x longer than the others, for `windows`
  // straggler windows.
  void SlowRank3(int windows) {
    for (int i = 0; i <= windows; ++i) {
      if (i > 0) now_ms_ += 10'000;
      const uint64_t step = 10 + static_cast<uint64_t>(i);
      ASSERT_TRUE(Beats("n1", {{0, step, 0, 1000, 0, 0, 100},
                               {1, step, 0, 1000, 0, 0, 110}})
                      .ok());
      ASSERT_TRUE(Beats("n2", {{2, step, 0, 1000, 0, 0, 105},
                               {3, step, 0, 1000, 0, 0, 300}})
                      .ok());
    }
  }
};

TEST_F(EvictStragglersTest, TheStragglersNodeIsReplacedByTheSpare) {
  ASSERT_NO_FATAL_FAILURE(SlowRank3(3));
  ASSERT_EQ(EventsOf(v1::STRAGGLER).size(), 1u);
  const v1::JobRecord job = Job();
  EXPECT_EQ(job.rank_node(2), "s1");
  EXPECT_EQ(job.rank_node(3), "s1");
  EXPECT_EQ(job.rank_node(0), "n1");
  EXPECT_TRUE(Node("n2").cordoned());
  auto cordoned = EventsOf(v1::CORDONED);
  ASSERT_EQ(cordoned.size(), 1u);
  EXPECT_EQ(cordoned[0].cordon().by(), "straggler");
  EXPECT_EQ(cordoned[0].cordon().reason().rfind("straggler: rank 3 ", 0), 0u)
      << cordoned[0].cordon().reason();
  EXPECT_EQ(coord_->GetCluster().stragglers_size(), 0);  // replaced
}

TEST_F(EvictStragglersTest, WithoutASpareNothingIsEvictedAndAnEventSaysWhy) {
  v1::CordonRequest spare;
  spare.set_node_id("s1");
  spare.set_reason("under repair");
  ASSERT_TRUE(coord_->Cordon(spare).ok());
  ASSERT_NO_FATAL_FAILURE(SlowRank3(3));
  ASSERT_EQ(EventsOf(v1::STRAGGLER).size(), 1u);
  EXPECT_EQ(Job().rank_node(3), "n2");
  EXPECT_EQ(Job().generation(), 0u);  // no plan
  EXPECT_FALSE(Node("n2").cordoned());
  auto skipped = EventsOf(v1::EVICTION_SKIPPED);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].node_id(), "n2");
  EXPECT_EQ(skipped[0].cordon().by(), "straggler");
  // The mark stays for `ckptctl cluster`.
  const v1::GetClusterResponse c = coord_->GetCluster();
  ASSERT_EQ(c.stragglers_size(), 1);
  EXPECT_EQ(c.stragglers(0).rank(), 3u);
  EXPECT_EQ(c.stragglers(0).node_id(), "n2");
  EXPECT_EQ(c.stragglers(0).job(), "job");
}

TEST_F(HangTest, BadProgressIsRefusedNamingTheField) {
  v1::HeartbeatRequest req;
  req.set_node_id("n1");
  req.set_epoch(e1_);
  v1::RankProgress* p = req.add_progress();
  p->set_job("job");
  p->set_pause_reason(std::string("bad\x01", 4));
  auto r = coord_->Heartbeat(req);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("progress[0].pause_reason"),
            std::string::npos)
      << r.status();
  p->set_pause_reason("");
  p->set_ms_since_advance(uint64_t{1} << 60);
  r = coord_->Heartbeat(req);
  EXPECT_NE(r.status().message().find("progress[0].ms_since_advance"),
            std::string::npos)
      << r.status();
}

TEST_F(HangTest, StacksAreKeptPerGenerationAndTheOldestDropped) {
  for (uint64_t g = 0; g <= 9; ++g) {
    v1::ReportStacksRequest req;
    req.set_node_id("n2");
    req.set_job("job");
    req.set_generation(0);
    v1::RankStacks* r = req.add_ranks();
    r->set_rank(2);
    r->set_pid(1234);
    r->set_tool("gdb");
    r->set_text("#0 pause ()\n");
    // Only generation 0 exists: every report is of it; a newer one is
    // refused.
    if (g == 9) {
      req.set_generation(7);
      EXPECT_EQ(coord_->ReportStacks(req).status().code(),
                absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(coord_->ReportStacks(req).ok());
  }
  EXPECT_TRUE(HasEvent(v1::STACKS_CAPTURED));
  v1::GetStacksRequest get;
  get.set_job("job");
  auto got = coord_->GetStacks(get);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->reports_size(), 1);
  EXPECT_EQ(got->reports(0).node_id(), "n2");
  EXPECT_EQ(got->reports(0).ranks(0).text(), "#0 pause ()\n");
  get.set_has_generation(true);
  get.set_generation(5);
  EXPECT_EQ(coord_->GetStacks(get).status().code(),
            absl::StatusCode::kNotFound);
  v1::ReportStacksRequest big;
  big.set_node_id("n2");
  big.set_job("job");
  big.add_ranks()->set_text(std::string(Coordinator::kMaxStackBytes + 1, 'x'));
  auto refused = coord_->ReportStacks(big);
  EXPECT_NE(refused.status().message().find("ranks[0].text"),
            std::string::npos);
}

}  // namespace
}  // namespace ckpt::coordinator
