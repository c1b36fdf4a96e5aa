// A node whose restores keep claiming good copies bad (FALLBACK with
// verified_bad false: the node's own check found the copy good and kept
// it) is suspect: the claims count in its health verdict and toward its
// cordon, and nothing of the job's data or timeline is dropped for them.
// On the fake clock.
#include <prometheus/text_serializer.h>

#include <filesystem>
#include <fstream>

#include "coordinator/coordinator_testing.h"
#include "coordinator/options.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

TEST(ClaimLogTest, CountsClaimsWithinTheWindow) {
  const SuspectPolicy p{/*after=*/3, /*window_s=*/100};
  ClaimLog log;
  EXPECT_EQ(log.Add(p, 0), 1);
  EXPECT_EQ(log.Add(p, 10), 2);
  EXPECT_FALSE(ClaimLog::Due(p, 2));
  // 100 s after the first, it no longer counts.
  EXPECT_EQ(log.Add(p, 100'001), 2);
  EXPECT_EQ(log.Add(p, 100'002), 3);
  EXPECT_TRUE(ClaimLog::Due(p, 3));
  EXPECT_FALSE(ClaimLog::Due(SuspectPolicy{0, 100}, 50));  // 0: never
  const v1::HealthCheck c = SuspectCheck(p, 3);
  EXPECT_EQ(c.name(), "restore_claims");
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.reason(),
            "3 copies claimed bad by restores on this node within 100 s were "
            "verified good by the node (--suspect-after-claims 3): suspect "
            "its memory or device");
}

class SuspectTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    heartbeat_timeout_ms_ = 3'600'000;  // nodes stay alive across windows
    TwoNodeTest::SetUp();
  }
  // Node n2's restore of `rank` claimed its memory copy of step 1 bad;
  // `verified_bad` is what n2's own check of the copy found.
  absl::Status Claim(uint32_t rank, bool verified_bad = false) {
    v1::ReportFallbackRequest req;
    req.set_node_id("n2");
    req.set_epoch(e2_);
    req.set_job("job");
    req.set_step(1);
    req.set_rank(rank);
    req.set_copy("memory");
    req.set_reason("checksum mismatch in tensor w");
    req.set_next_copy(verified_bad ? "file" : "memory");
    req.set_verified_bad(verified_bad);
    return coord_->ReportFallback(req).status();
  }
  std::string Text() {
    return prometheus::TextSerializer().Serialize(
        coord_->options().metrics->Collect());
  }
};

TEST_F(SuspectTest,
       RepeatedUnconfirmedClaimsMakeTheNodeSuspectDroppingNothing) {
  ReportAll(1, v1::STAGED);
  ReportAll(1, v1::DURABLE);
  ASSERT_EQ(Job().last_good_step(), 1u);
  ASSERT_TRUE(Claim(2).ok());
  ASSERT_TRUE(Claim(3).ok());
  EXPECT_FALSE(Node("n2").unhealthy()) << "two claims are not yet a pattern";
  EXPECT_FALSE(HasEvent(v1::HEALTH_FAILED));
  ASSERT_TRUE(Claim(2).ok());  // the third within the window (default 1800 s)

  const v1::NodeRecord n2 = Node("n2");
  EXPECT_TRUE(n2.unhealthy());
  EXPECT_EQ(n2.unhealthy_check(), "restore_claims");
  EXPECT_NE(n2.unhealthy_reason().find("3 copies"), std::string::npos)
      << n2.unhealthy_reason();
  auto failed = EventsOf(v1::HEALTH_FAILED);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].node_id(), "n2");
  EXPECT_EQ(failed[0].health().check(), "restore_claims");
  EXPECT_EQ(ckpt::testing::SampleValue(Text(), "ckpt_coordinator_node_healthy",
                                       {{"node", "n2"}}),
            0.0);
  // Like any unhealthy node: its ranks move to the spare.
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().rank_node(3), "s1");
  // Nothing is dropped for a claim: the committed step, its manifest and
  // the timeline stay.
  EXPECT_EQ(Job().last_good_step(), 1u);
  EXPECT_EQ(Job().manifest_steps_size(), 1);
  EXPECT_TRUE(std::filesystem::exists(ManifestPath(1)));
  EXPECT_EQ(Job().restore_step(), 1u);
  Reopen();  // the verdict is durable, like the node's other checks
  EXPECT_EQ(Node("n2").unhealthy_check(), "restore_claims");
}

TEST_F(SuspectTest, ClaimsOutsideTheWindowOrConfirmedBadDoNotAddUp) {
  suspect_ = SuspectPolicy{/*after=*/2, /*window_s=*/10};
  Reopen();
  ASSERT_TRUE(Claim(2).ok());
  now_ms_ += 10'001;  // the first claim leaves the window
  ASSERT_TRUE(Claim(2).ok());
  // Copies the node's check found bad are the copies' fault, not the node's.
  ASSERT_TRUE(Claim(3, /*verified_bad=*/true).ok());
  ASSERT_TRUE(Claim(3, /*verified_bad=*/true).ok());
  EXPECT_FALSE(Node("n2").unhealthy());
  EXPECT_EQ(Job().rank_node(2), "n2");
  ASSERT_TRUE(Claim(3).ok());  // two unconfirmed within 10 s
  EXPECT_EQ(Node("n2").unhealthy_check(), "restore_claims");
}

TEST_F(SuspectTest, AFenceOrRankElsewhereRefusesTheClaimAndCountsNothing) {
  suspect_ = SuspectPolicy{/*after=*/1, /*window_s=*/10};
  Reopen();
  v1::ReportFallbackRequest req;
  req.set_node_id("n2");
  req.set_epoch(e2_);
  req.set_job("job");
  req.set_step(1);
  req.set_rank(0);  // hosted by n1
  req.set_copy("memory");
  req.set_reason("checksum mismatch");
  req.set_next_copy("memory");
  req.set_verified_bad(false);
  EXPECT_FALSE(coord_->ReportFallback(req).ok());
  req.set_rank(2);
  req.set_epoch(e2_ + 100);
  EXPECT_EQ(coord_->ReportFallback(req).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Node("n2").unhealthy());
  EXPECT_FALSE(HasEvent(v1::HEALTH_FAILED));
}

// A suspect node's restore that claims is an incident toward its cordon,
// counted with crashes and hangs.
TEST_F(SuspectTest, ACrashAndASuspectRestoreOnOneNodeCordonIt) {
  suspect_ = SuspectPolicy{/*after=*/2, /*window_s=*/600};
  cordon_ = CordonPolicy{/*after=*/2, /*window_s=*/600};
  Reopen();
  v1::ReportTrainerExitRequest exit = TrainerExit("n2", e2_, 2, 9);
  exit.set_generation(Job().generation());
  ASSERT_TRUE(coord_->ReportTrainerExit(exit).ok());  // incident 1
  ASSERT_FALSE(Node("n2").cordoned());
  ASSERT_EQ(Job().rank_node(2), "n2");  // restarted in place
  ASSERT_TRUE(Claim(2).ok());
  ASSERT_TRUE(Claim(3).ok());  // suspect, in the new generation: incident 2
  const v1::NodeRecord n2 = Node("n2");
  EXPECT_TRUE(n2.cordoned());
  EXPECT_EQ(n2.cordon_reason().rfind(
                "1 hangs or trainer crashes and 1 suspect restore within 600 "
                "s (--cordon-after 2); the last: rank 3 step 1: ",
                0),
            0u)
      << n2.cordon_reason();
  EXPECT_EQ(n2.unhealthy_check(), "restore_claims");
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().rank_node(3), "s1");
  EXPECT_EQ(EventsOf(v1::CORDONED).size(), 1u);
}

TEST_F(SuspectTest, RegisteringAgainStartsAfresh) {
  suspect_ = SuspectPolicy{/*after=*/2, /*window_s=*/600};
  Reopen();
  ASSERT_TRUE(Claim(2).ok());
  ASSERT_TRUE(Claim(2).ok());
  ASSERT_TRUE(Node("n2").unhealthy());
  // A restart of its ckptd (after a repair) registers a new report.
  heartbeat_timeout_ms_ = 3000;
  Reopen();
  now_ms_ += 3001;
  ASSERT_TRUE(coord_->Tick().ok());
  ASSERT_EQ(Node("n2").health(), v1::DEAD);
  e2_ = Register("n2", 2);
  EXPECT_FALSE(Node("n2").unhealthy());
}

absl::StatusOr<CoordinatorServerOptions> ParseSuspectArgs(
    std::vector<std::string> extra) {
  std::vector<std::string> args = {"ckpt-coordinator", "--listen",
                                   "127.0.0.1:0",      "--state",
                                   "/nonexistent",     "--insecure"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::string help;
  return ParseCoordinatorOptions(static_cast<int>(argv.size()), argv.data(),
                                 &help);
}

TEST(SuspectOptionsTest, ThresholdComesFromFlagsOrTheConfigFileOrIsRefused) {
  auto o = ParseSuspectArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.suspect.after, 3);
  EXPECT_EQ(o->coordinator.suspect.window_s, 1800);
  o = ParseSuspectArgs(
      {"--suspect-after-claims", "0", "--suspect-claims-window-s", "60"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.suspect.after, 0);
  EXPECT_EQ(o->coordinator.suspect.window_s, 60);
  ckpt::testing::TempDir dir;
  const std::string config = dir.path() + "/coordinator.toml";
  std::ofstream(config) << "suspect_after_claims = 5\n"
                           "suspect_claims_window_s = 120\n";
  o = ParseSuspectArgs({"--config", config});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.suspect.after, 5);
  EXPECT_EQ(o->coordinator.suspect.window_s, 120);
  o = ParseSuspectArgs({"--suspect-after-claims", "-1"});
  EXPECT_NE(o.status().message().find("--suspect-after-claims"),
            std::string::npos)
      << o.status();
  std::ofstream(config, std::ios::trunc) << "suspect_after_claims = 1001\n";
  o = ParseSuspectArgs({"--config", config});
  EXPECT_NE(o.status().message().find("suspect_after_claims"),
            std::string::npos)
      << o.status();
}

}  // namespace
}  // namespace ckpt::coordinator
