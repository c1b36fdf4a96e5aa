// Node health in the coordinator (health_state.h, coordinator_health.cc),
// with the fake clock: unhealthy nodes get no ranks, neither at placement
// nor in a recovery plan, and a plan that cannot place says why.
#include <prometheus/text_serializer.h>

#include <cmath>

#include "coordinator/coordinator_testing.h"
#include "coordinator/health_state.h"

namespace ckpt::coordinator {
namespace {

v1::NodeHealthReport HealthReport(double memcpy_gbps,
                                  const std::string& failed = "",
                                  const std::string& reason = "") {
  v1::NodeHealthReport r;
  v1::HealthCheck* m = r.add_checks();
  m->set_name("memcpy");
  m->set_passed(true);
  m->set_figure(memcpy_gbps);
  m->set_unit("GB/s");
  for (const char* name : {"shm", "root"}) {
    v1::HealthCheck* c = r.add_checks();
    c->set_name(name);
    c->set_passed(failed != name);
    if (failed == name) c->set_reason(reason);
  }
  return r;
}

TEST(HealthStateTest, MedianNeedsTwoNodesAndSkipsFailedFigures) {
  const auto a = HealthReport(10), b = HealthReport(20), c = HealthReport(3),
             d = HealthReport(0);
  EXPECT_TRUE(MedianFigures({&a}).empty());
  EXPECT_EQ(MedianFigures({&a, &b}).at("memcpy"), 15);
  EXPECT_EQ(MedianFigures({&a, &b, &c, &d}).at("memcpy"), 10);
}

TEST(HealthStateTest, ClusterMediansAreExactWhenSmallAndDriftBoundedAtScale) {
  ClusterMedians m;
  EXPECT_TRUE(m.Stale()) << "none taken yet";
  std::vector<v1::NodeHealthReport> held(4096, HealthReport(10));
  std::vector<const v1::NodeHealthReport*> reports;
  for (const auto& r : held) reports.push_back(&r);
  std::vector<const v1::NodeHealthReport*> small(reports.begin(),
                                                 reports.begin() + 64);
  m.Take(small);
  EXPECT_FALSE(m.Stale());
  m.Changed();
  EXPECT_TRUE(m.Stale()) << "64 reports: any change takes them again";
  m.Take(reports);
  EXPECT_EQ(m.medians().at("memcpy"), 10);
  for (int i = 1; i < 4096 / 16; ++i) {
    m.Changed();
    ASSERT_FALSE(m.Stale()) << i << " changes of 4096";
  }
  m.Changed();
  EXPECT_TRUE(m.Stale()) << "4096 / 16 changes";
}

TEST(HealthStateTest, OwnFailedCheckOrLowFigureIsUnhealthy) {
  const std::map<std::string, double> medians{{"memcpy", 10}};
  EXPECT_TRUE(JudgeHealth(HealthReport(5), medians, 0.5).healthy);
  HealthVerdict slow = JudgeHealth(HealthReport(4.9), medians, 0.5);
  EXPECT_FALSE(slow.healthy);
  EXPECT_EQ(slow.check, "memcpy");
  EXPECT_EQ(slow.reason,
            "4.90 GB/s is below 0.50 x the cluster's median 10.00 GB/s");
  HealthVerdict root =
      JudgeHealth(HealthReport(10, "root", "EROFS"), medians, 0.5);
  EXPECT_FALSE(root.healthy);
  EXPECT_EQ(root.check, "root");
  EXPECT_EQ(root.reason, "EROFS");
  EXPECT_TRUE(JudgeHealth(v1::NodeHealthReport(), medians, 0.5).healthy);
}

class HealthTest : public CoordinatorTest {
 protected:
  absl::StatusOr<v1::RegisterNodeResponse> RegisterWith(
      const std::string& node, uint32_t capacity, bool spare,
      const v1::NodeHealthReport& report) {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_capacity(capacity);
    req.set_spare(spare);
    *req.mutable_health_report() = report;
    return coord_->RegisterNode(req);
  }
  // A heartbeat of `node` carrying `report`, as the answer to check `id`
  // (0: a routine re-check nobody asked for).
  absl::StatusOr<v1::HeartbeatResponse> HealthBeat(
      const std::string& node, uint64_t epoch,
      const v1::NodeHealthReport& report, uint64_t id = 0) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    *req.mutable_health_report() = report;
    req.set_health_check_id(id);
    return coord_->Heartbeat(req);
  }
  uint64_t Must(absl::StatusOr<v1::RegisterNodeResponse> r) {
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->epoch() : 0;
  }
  // Ten minutes and a second of heartbeats from n1, n2 and s1 (every
  // report is stale then); then n2 stops heartbeating and is declared dead.
  void AgeReports(uint64_t e1, uint64_t e2, uint64_t es1) {
    for (int i = 0; i < 304; ++i) {
      now_ms_ += 2000;
      ASSERT_TRUE(Heartbeat("n1", e1).ok());
      ASSERT_TRUE(Heartbeat("s1", es1).ok());
      if (i < 301) {
        ASSERT_TRUE(Heartbeat("n2", e2).ok());
      }
    }
    ASSERT_EQ(Node("n2").health(), v1::DEAD);
  }
};

TEST_F(HealthTest, NodeWithFailedCheckGetsNoRanksAndAHealthFailedEvent) {
  Must(RegisterWith("n1", 2, false, HealthReport(10)));
  Must(
      RegisterWith("n2", 2, false, HealthReport(10, "root", "EROFS on /ckpt")));
  EXPECT_TRUE(Node("n2").unhealthy());
  EXPECT_FALSE(Node("n1").unhealthy());
  auto events = EventsOf(v1::HEALTH_FAILED);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].node_id(), "n2");
  EXPECT_EQ(events[0].health().check(), "root");
  EXPECT_EQ(events[0].health().reason(), "EROFS on /ckpt");

  v1::RegisterJobRequest big;
  big.set_job("big");
  big.set_world_size(4);
  auto refused = coord_->RegisterJob(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  RegisterJob("job", 2);
  EXPECT_EQ(Job().rank_node(0), "n1");
  EXPECT_EQ(Job().rank_node(1), "n1");
}

// A figure below the ratio of the median is one sample, perhaps taken
// under a burst of load: the node is asked to measure again, takes no
// ranks meanwhile, and is judged unhealthy only when its answer is low too.
TEST_F(HealthTest, BandwidthBelowRatioOfMedianIsUnhealthyOnceMeasuredAgain) {
  Must(RegisterWith("n1", 1, false, HealthReport(10)));
  Must(RegisterWith("n2", 1, false, HealthReport(11)));
  const uint64_t e3 = Must(RegisterWith("n3", 1, false, HealthReport(2)));
  EXPECT_FALSE(Node("n3").unhealthy()) << "judged on one sample";
  EXPECT_TRUE(EventsOf(v1::HEALTH_FAILED).empty());
  v1::RegisterJobRequest three;
  three.set_job("three");
  three.set_world_size(3);
  EXPECT_EQ(coord_->RegisterJob(three).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "n3 took a rank before its re-check";
  auto asked = Heartbeat("n3", e3);
  ASSERT_TRUE(asked.ok()) << asked.status();
  ASSERT_NE(asked->run_health_check(), 0u);
  auto answered =
      HealthBeat("n3", e3, HealthReport(2.5), asked->run_health_check());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->run_health_check(), 0u) << "asked once";
  EXPECT_FALSE(Node("n1").unhealthy());
  EXPECT_FALSE(Node("n2").unhealthy());
  EXPECT_TRUE(Node("n3").unhealthy());
  EXPECT_EQ(Node("n3").unhealthy_check(), "memcpy");
  EXPECT_EQ(EventsOf(v1::HEALTH_FAILED).size(), 1u);
  const std::string text = prometheus::TextSerializer().Serialize(
      coord_->options().metrics->Collect());
  EXPECT_NE(text.find("ckpt_coordinator_node_healthy{node=\"n3\"} 0"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ckpt_coordinator_node_healthy{node=\"n1\"} 1"),
            std::string::npos);
}

// With the medians kept between registrations (ClusterMedians), a node
// of a large cluster is still judged on its registration, against the
// medians of the nodes before it; a node whose verdict the medians' move
// changes is judged again when they are taken again.
TEST_F(HealthTest, AtScaleARegistrationIsJudgedAtOnceAgainstKeptMedians) {
  const int n = 200;
  for (int i = 0; i < n; ++i)
    Must(RegisterWith("n" + std::to_string(i), 1, false, HealthReport(10)));
  Must(RegisterWith("bad", 1, false, HealthReport(10, "root", "EIO")));
  EXPECT_TRUE(Node("bad").unhealthy()) << "its own failed check";
  const uint64_t slow = Must(RegisterWith("slow", 1, false, HealthReport(2)));
  auto asked = Heartbeat("slow", slow);
  ASSERT_TRUE(asked.ok()) << asked.status();
  ASSERT_NE(asked->run_health_check(), 0u)
      << "2 GB/s against a median of 10, judged on its registration";
  ASSERT_TRUE(
      HealthBeat("slow", slow, HealthReport(2), asked->run_health_check())
          .ok());
  EXPECT_TRUE(Node("slow").unhealthy());
  EXPECT_EQ(Node("slow").unhealthy_check(), "memcpy");
  // 250 nodes at 1 GB/s move the median to 1: "slow" (2 GB/s) is no
  // longer below half of it once the medians are taken again, within
  // 1/16 of the reports' changes.
  for (int i = 0; i < 250; ++i)
    Must(RegisterWith("m" + std::to_string(i), 1, false, HealthReport(1)));
  EXPECT_FALSE(Node("slow").unhealthy())
      << "judged again when the medians moved";
  EXPECT_TRUE(Node("bad").unhealthy());
}

TEST_F(HealthTest, LowFigureThatIsFineWhenMeasuredAgainLeavesTheNodeHealthy) {
  Must(RegisterWith("n1", 1, false, HealthReport(10)));
  Must(RegisterWith("n2", 1, false, HealthReport(11)));
  const uint64_t e3 = Must(RegisterWith("n3", 1, false, HealthReport(2)));
  auto asked = Heartbeat("n3", e3);
  ASSERT_TRUE(asked.ok()) << asked.status();
  ASSERT_NE(asked->run_health_check(), 0u);
  auto answered =
      HealthBeat("n3", e3, HealthReport(9), asked->run_health_check());
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->run_health_check(), 0u);
  EXPECT_FALSE(Node("n3").unhealthy());
  EXPECT_TRUE(EventsOf(v1::HEALTH_FAILED).empty());
  RegisterJob("job", 3);
  EXPECT_EQ(Job().rank_node(2), "n3");
}

TEST_F(HealthTest, PlanSkipsUnhealthySpareAndUsesAnother) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  Must(RegisterWith("n2", 2, false, HealthReport(10)));
  Must(RegisterWith("s1", 2, true, HealthReport(10, "shm", "too small")));
  Must(RegisterWith("s2", 2, true, HealthReport(10)));
  RegisterJob("job", 4);
  // n2 stops heartbeating: its ranks move to s2, never to s1.
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  ASSERT_TRUE(Heartbeat("s2", Node("s2").epoch()).ok());
  now_ms_ += 2000;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().rank_node(2), "s2");
  EXPECT_EQ(Job().rank_node(3), "s2");
  EXPECT_TRUE(Node("s1").spare());
}

TEST_F(HealthTest, PlanWithOnlyAnUnhealthySpareWaitsAndSaysWhy) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  Must(RegisterWith("n2", 2, false, HealthReport(10)));
  const uint64_t es = Must(
      RegisterWith("s1", 2, true, HealthReport(10, "root", "not a directory")));
  RegisterJob("job", 4);
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  ASSERT_TRUE(Heartbeat("s1", es).ok());
  now_ms_ += 2000;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  auto waiting = EventsOf(v1::PLAN_WAITING);
  ASSERT_FALSE(waiting.empty());
  EXPECT_NE(waiting.back().detail().find(
                "spare s1 is unhealthy (root: not a directory)"),
            std::string::npos)
      << waiting.back().detail();
  // s1 re-registers healthy (its root fixed): the plan goes ahead on it.
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  for (int i = 0; i < 2; ++i) {
    now_ms_ += 2000;
    ASSERT_TRUE(Heartbeat("n1", e1).ok());
  }
  ASSERT_TRUE(coord_->Tick().ok());
  ASSERT_EQ(Node("s1").health(), v1::DEAD);
  Must(RegisterWith("s1", 2, true, HealthReport(10)));
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_NE(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
}

TEST_F(HealthTest, VerdictSurvivesACoordinatorRestart) {
  Must(RegisterWith("n1", 2, false, HealthReport(10, "shm", "full")));
  Reopen();
  EXPECT_TRUE(Node("n1").unhealthy());
  EXPECT_EQ(Node("n1").unhealthy_reason(), "full");
}

// ckptrun found a trainer still there seconds after SIGKILL (uninterruptible
// sleep): the node is unhealthy with that check, and its ranks move.
TEST_F(HealthTest, AnUnkillableTrainerMakesItsNodeUnhealthyAndMovesItsRanks) {
  Must(RegisterWith("n1", 2, false, HealthReport(10)));
  const uint64_t e2 = Must(RegisterWith("n2", 2, false, HealthReport(10)));
  Must(RegisterWith("s1", 2, true, HealthReport(10)));
  RegisterJob("job", 4);
  v1::ReportNodeCheckRequest req;
  req.set_node_id("n2");
  req.set_epoch(e2);
  v1::HealthCheck* c = req.mutable_check();
  c->set_name("trainer_unkillable");
  c->set_passed(false);
  c->set_reason(
      "trainer of rank 2 (pid 77, state D) still there 10 s after "
      "SIGKILL");
  c->set_reason(std::string("bad\x01", 4));
  auto bad = coord_->ReportNodeCheck(req);
  EXPECT_EQ(bad.status().message().rfind("check.reason: ", 0), 0u)
      << bad.status();
  c->set_reason(
      "trainer of rank 2 (pid 77, state D) still there 10 s after "
      "SIGKILL");
  req.set_epoch(e2 + 100);
  EXPECT_EQ(coord_->ReportNodeCheck(req).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Node("n2").unhealthy());  // refusals change nothing
  req.set_epoch(e2);
  auto r = coord_->ReportNodeCheck(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->unhealthy());
  EXPECT_EQ(Node("n2").unhealthy_check(), "trainer_unkillable");
  auto events = EventsOf(v1::HEALTH_FAILED);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].node_id(), "n2");
  EXPECT_EQ(events[0].health().check(), "trainer_unkillable");
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().rank_node(3), "s1");
  EXPECT_EQ(Job().rank_node(0), "n1");
  Reopen();  // durable, like the node's other checks
  EXPECT_EQ(Node("n2").unhealthy_check(), "trainer_unkillable");
}

TEST_F(HealthTest, AnUnhealthyHostWithoutASpareKeepsItsRanks) {
  Must(RegisterWith("n1", 2, false, HealthReport(10)));
  const uint64_t e2 = Must(RegisterWith("n2", 2, false, HealthReport(10)));
  RegisterJob("job", 4);
  v1::ReportNodeCheckRequest req;
  req.set_node_id("n2");
  req.set_epoch(e2);
  req.mutable_check()->set_name("trainer_unkillable");
  req.mutable_check()->set_reason("still there");
  ASSERT_TRUE(coord_->ReportNodeCheck(req).ok());
  EXPECT_TRUE(Node("n2").unhealthy());
  // No spare: the job restarts in place rather than wait for one.
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().rank_node(2), "n2");
  EXPECT_EQ(Job().lost_ranks_size(), 0);
}

TEST_F(HealthTest, BadReportIsRefusedNamingTheField) {
  v1::NodeHealthReport r = HealthReport(10);
  r.mutable_checks(0)->set_figure(std::nan(""));
  auto refused = RegisterWith("n1", 2, false, r);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("health_report.checks[0].figure"),
            std::string::npos)
      << refused.status();
  r = HealthReport(10);
  r.mutable_checks(1)->set_reason("bad\nline");
  refused = RegisterWith("n1", 2, false, r);
  EXPECT_NE(refused.status().message().find("health_report.checks[1].reason"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(coord_->GetCluster().nodes().empty());
}

// A spare whose report is older than spare_check_max_age_ms is checked
// again before it takes ranks: the plan waits, the spare is asked (in its
// heartbeat's answer), and its fresh report decides. Here the fresh report
// says its root broke since it registered: the ranks go to the other spare.
TEST_F(HealthTest, StaleSpareIsCheckedAgainBeforeItTakesRanks) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  const uint64_t e2 = Must(RegisterWith("n2", 2, false, HealthReport(10)));
  const uint64_t es1 = Must(RegisterWith("s1", 2, true, HealthReport(10)));
  RegisterJob("job", 4);
  ASSERT_EQ(coord_->options().spare_check_max_age_ms, 600000);
  AgeReports(e1, e2, es1);
  // Without the re-check, s1 (the only spare, healthy at registration)
  // would host ranks 2 and 3 now.
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  EXPECT_TRUE(Node("s1").spare());
  auto waiting = EventsOf(v1::PLAN_WAITING);
  ASSERT_FALSE(waiting.empty());
  EXPECT_NE(waiting.back().detail().find("spare s1's health check is "),
            std::string::npos)
      << waiting.back().detail();
  auto asked = Heartbeat("s1", es1);
  ASSERT_TRUE(asked.ok());
  const uint64_t id = asked->run_health_check();
  EXPECT_NE(id, 0u);
  EXPECT_GE(Node("s1").ms_since_health_check(), 600000);
  // The fresh report: the root broke meanwhile.
  auto answered =
      HealthBeat("s1", es1, HealthReport(10, "root", "ENOTDIR"), id);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(answered->run_health_check(), 0u);  // asked once
  EXPECT_TRUE(Node("s1").unhealthy());
  EXPECT_EQ(Node("s1").unhealthy_check(), "root");
  EXPECT_EQ(Node("s1").health_check_id(), id);
  EXPECT_EQ(Node("s1").ms_since_health_check(), 0);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  // A fresh spare registers: it takes the ranks at once.
  Must(RegisterWith("s2", 2, true, HealthReport(10)));
  EXPECT_EQ(Job().rank_node(2), "s2");
  EXPECT_EQ(Job().rank_node(3), "s2");
}

TEST_F(HealthTest, StaleSpareWhoseFreshReportPassesTakesTheRanks) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  const uint64_t e2 = Must(RegisterWith("n2", 2, false, HealthReport(10)));
  const uint64_t es1 = Must(RegisterWith("s1", 2, true, HealthReport(10)));
  RegisterJob("job", 4);
  AgeReports(e1, e2, es1);
  ASSERT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  auto asked = Heartbeat("s1", es1);
  ASSERT_TRUE(asked.ok());
  ASSERT_TRUE(
      HealthBeat("s1", es1, HealthReport(10), asked->run_health_check()).ok());
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_NE(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
}

// A heartbeat's report replaces the checks of its names; others (the
// network check, a launcher's) stay. An idle node's own re-check carries
// no id and leaves the on-demand id alone.
TEST_F(HealthTest, HeartbeatReportReplacesOnlyItsOwnChecks) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  v1::ReportNodeCheckRequest unkillable;
  unkillable.set_node_id("n1");
  unkillable.set_epoch(e1);
  unkillable.mutable_check()->set_name("trainer_unkillable");
  unkillable.mutable_check()->set_passed(false);
  unkillable.mutable_check()->set_reason("pid 7 outlived SIGKILL");
  ASSERT_TRUE(coord_->ReportNodeCheck(unkillable).ok());
  ASSERT_TRUE(HealthBeat("n1", e1, HealthReport(12)).ok());
  const v1::NodeRecord n1 = Node("n1");
  std::map<std::string, int> names;
  for (const auto& c : n1.health_report().checks()) ++names[c.name()];
  EXPECT_EQ(
      names,
      (std::map<std::string, int>{
          {"memcpy", 1}, {"root", 1}, {"shm", 1}, {"trainer_unkillable", 1}}));
  EXPECT_TRUE(n1.unhealthy());
  EXPECT_EQ(n1.unhealthy_check(), "trainer_unkillable");
  EXPECT_EQ(n1.health_check_id(), 0u);
}

TEST_F(HealthTest, CheckHealthAsksAliveNodesAndRefusesUnknownOnes) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  const uint64_t e2 = Must(RegisterWith("n2", 2, true, HealthReport(10)));
  v1::CheckHealthRequest one;
  one.set_node_id("zz");
  auto refused = coord_->CheckHealth(one);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(
      refused.status().message().find("node_id: \"zz\" is not registered"),
      std::string::npos)
      << refused.status();
  auto none = Heartbeat("n1", e1);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->run_health_check(), 0u);  // the refusal asked nobody
  one.set_node_id(std::string("n\x01", 2));
  EXPECT_EQ(coord_->CheckHealth(one).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto all = coord_->CheckHealth(v1::CheckHealthRequest());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(
      std::vector<std::string>(all->node_ids().begin(), all->node_ids().end()),
      (std::vector<std::string>{"n1", "n2"}));
  for (auto [node, epoch] : {std::pair{"n1", e1}, std::pair{"n2", e2}}) {
    auto hb = Heartbeat(node, epoch);
    ASSERT_TRUE(hb.ok());
    EXPECT_EQ(hb->run_health_check(), all->request_id()) << node;
  }
  // A later request gets a new id, so a node runs it too.
  one.set_node_id("n2");
  auto again = coord_->CheckHealth(one);
  ASSERT_TRUE(again.ok());
  EXPECT_GT(again->request_id(), all->request_id());
  EXPECT_EQ(Heartbeat("n2", e2)->run_health_check(), again->request_id());
}

// A re-check that says what the last one said changes nothing: an
// unhealthy node that keeps its ranks (no spare) is not restarted again by
// every report (`ckptctl health`, an on-demand check).
TEST_F(HealthTest, RepeatedFailedReportDoesNotRestartTheJobAgain) {
  const uint64_t e1 = Must(RegisterWith("n1", 2, false, HealthReport(10)));
  RegisterJob("job", 2);
  ASSERT_TRUE(HealthBeat("n1", e1, HealthReport(10, "root", "EIO")).ok());
  ASSERT_TRUE(Node("n1").unhealthy());
  const uint64_t generation = Job().generation();
  EXPECT_EQ(Job().rank_node(0), "n1");  // no spare: it keeps its ranks
  for (int i = 0; i < 3; ++i) {
    now_ms_ += 1000;
    ASSERT_TRUE(HealthBeat("n1", e1, HealthReport(10, "root", "EIO")).ok());
  }
  EXPECT_EQ(Job().generation(), generation);
}

}  // namespace
}  // namespace ckpt::coordinator
