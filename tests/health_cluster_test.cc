// Node health with real processes: a spare whose
// /dev/shm has no room for its --capacity fails its health check at start,
// reports it with its registration, and is never given ranks; the plan
// for a killed node takes the healthy spare instead. ckptctl shows both.
// And the pairwise network check: of three nodes, the one whose links are
// slow (a test-only throttle) is unhealthy for "network", the others not.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/cluster_harness.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

class HealthClusterTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if ((HasFailure() || std::getenv("CKPT_TEST_LOGS")) && cluster_)
      std::fprintf(stderr, "%s", cluster_->DumpLogs().c_str());
  }
  std::string Ctl(const std::string& args) {
    return RunCommand(std::string(CKPTCTL_PATH) + " --coordinator 127.0.0.1:" +
                          std::to_string(cluster_->coordinator_port()) +
                          " --insecure " + args,
                      /*with_stderr=*/true, 30)
        .out;
  }
  // Nodes a and b host a 4-rank job, c and d are spares; returns once the
  // job has a good step 3.
  void StartTwoNodesAndTwoSpares(const ClusterOptions& o) {
    cluster_ = std::make_unique<Cluster>(o);
    cluster_->StartCoordinator();
    cluster_->StartNode("a");
    cluster_->StartNode("b");
    cluster_->StartNode("c", /*spare=*/true);
    cluster_->StartNode("d", /*spare=*/true);
    ASSERT_TRUE(Cluster::WaitUntil(
        [&] {
          auto job = cluster_->Job();
          return job && job->has_last_good() && job->last_good_step() >= 3;
        },
        seconds(60)))
        << "no progress";
  }
  // Node b dies; its ranks (2 and 3) must move to spare d.
  void KillBAndExpectItsRanksOnD() {
    cluster_->KillNode("b");
    ASSERT_TRUE(Cluster::WaitUntil(
        [&] {
          auto job = cluster_->Job();
          return job && job->rank_node(2) != "b";
        },
        seconds(60)));
    auto job = cluster_->Job();
    ASSERT_TRUE(job.has_value());
    EXPECT_EQ(job->rank_node(2), "d");
    EXPECT_EQ(job->rank_node(3), "d");
  }
  void ExpectLaunchersFinish(const std::vector<std::string>& ids) {
    for (const std::string& id : ids) {
      auto st = cluster_->WaitLauncher(id, seconds(120));
      ASSERT_TRUE(st.has_value())
          << "ckptrun of node " << id << " still running";
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << "ckptrun of node " << id << " wait status " << *st;
    }
  }
  // The node's root is no directory any more (a disk that went away).
  void BreakRoot(const std::string& node) {
    const std::string root = dir_.path() + "/node-" + node + "/root";
    ASSERT_EQ(RunCommand("mv " + root + " " + root + ".gone && touch " + root)
                  .exit_code,
              0);
  }
  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(HealthClusterTest, SpareWithTooLittleShmIsNeverGivenRanks) {
  ClusterOptions o;
  o.dir = dir_.path();
  o.world_size = 4;
  // "c" comes before "d" in node-id order: without its health check the
  // plan would choose it.
  o.node_ckptd_args["c"] = {"--health-shm-mib-per-rank", "1073741824"};
  o.steps_after_restore = 10;  // d's ranks need only show that they run
  ASSERT_NO_FATAL_FAILURE(StartTwoNodesAndTwoSpares(o));
  ASSERT_NO_FATAL_FAILURE(KillBAndExpectItsRanksOnD());
  ASSERT_NO_FATAL_FAILURE(ExpectLaunchersFinish({"a", "d"}));
  auto cluster = cluster_->GetCluster();
  ASSERT_TRUE(cluster.has_value());
  for (const auto& n : cluster->nodes()) {
    EXPECT_EQ(n.unhealthy(), n.node_id() == "c") << n.node_id();
    if (n.node_id() == "c") {
      EXPECT_TRUE(n.spare());
      EXPECT_EQ(n.unhealthy_check(), "shm");
    }
  }
  bool event = false;
  for (const auto& e : cluster_->Events())
    if (e.kind() == cv1::HEALTH_FAILED) {
      EXPECT_EQ(e.node_id(), "c");
      EXPECT_EQ(e.health().check(), "shm");
      event = true;
    }
  EXPECT_TRUE(event) << "no HEALTH_FAILED event";

  const std::string events = Ctl("events --json");
  EXPECT_NE(events.find("\"kind\":\"HEALTH_FAILED\""), std::string::npos)
      << events;
  EXPECT_NE(events.find("\"check\":\"shm\",\"reason\":\"/dev/shm has "),
            std::string::npos)
      << events;
  const std::string health = Ctl("health --node c --json");
  EXPECT_NE(health.find("\"node_id\":\"c\""), std::string::npos) << health;
  EXPECT_NE(health.find("\"healthy\":false,\"check\":\"shm\""),
            std::string::npos)
      << health;
  EXPECT_NE(health.find("\"name\":\"memcpy\",\"passed\":true"),
            std::string::npos)
      << health;
  const std::string table = Ctl("health");
  EXPECT_NE(table.find("NO (shm)"), std::string::npos) << table;
  EXPECT_EQ(Ctl("health --node zz").find("not registered") == std::string::npos,
            false);
}

TEST_F(HealthClusterTest, NodeWhoseLinksAreSlowFailsTheNetworkCheck) {
  ClusterOptions o;
  o.dir = dir_.path();
  o.world_size = 2;
  o.nproc_per_node = 1;
  // Every node takes part (loopback only); node c's probes, sent and
  // received, run at about 6 MB/s.
  o.ckptd_args = {"--health-net-port", "0"};
  o.node_ckptd_env["c"] = {"CKPTD_TEST_FAULT=slow-network"};
  o.coordinator_args = {"--health-min-ratio", "0.5"};  // the default's
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");
  cluster_->StartNode("b");
  cluster_->StartNode("c", /*spare=*/true);
  std::optional<cv1::Event> failed;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        for (const auto& e : cluster_->Events())
          if (e.kind() == cv1::HEALTH_FAILED) failed = e;
        return failed.has_value();
      },
      seconds(90)))
      << "no HEALTH_FAILED";
  std::printf("network check: %s\n", failed->detail().c_str());  // record
  EXPECT_EQ(failed->node_id(), "c");
  EXPECT_EQ(failed->health().check(), "network");
  EXPECT_NE(failed->health().reason().find("below 0.50 x the cluster's median"),
            std::string::npos)
      << failed->health().reason();
  auto cluster = cluster_->GetCluster();
  ASSERT_TRUE(cluster.has_value());
  for (const auto& n : cluster->nodes()) {
    EXPECT_EQ(n.unhealthy(), n.node_id() == "c") << n.node_id();
    bool figure = false;
    for (const auto& c : n.health_report().checks())
      if (c.name() == "network") figure = c.figure() > 0;
    EXPECT_TRUE(figure) << n.node_id() << ": no network figure";
  }
  const std::string health = Ctl("health --node c --json");
  EXPECT_NE(health.find("\"healthy\":false,\"check\":\"network\""),
            std::string::npos)
      << health;
  EXPECT_NE(ReadFileToString(dir_.path() + "/node-a/ckptd.log")
                .find("network check: listening on 127.0.0.1:"),
            std::string::npos);
}

// A spare is checked again before it takes ranks: spare
// c's root breaks after it started (its start check passed); when node b
// dies, the coordinator finds c's report older than
// --spare-check-max-age-s, asks for a fresh one, and gives b's ranks to
// spare d instead. Then `ckptctl health` runs every alive node's checks on
// demand and shows each answer.
TEST_F(HealthClusterTest, SpareWhoseRootBrokeIsCheckedBeforeItTakesRanks) {
  ClusterOptions o;
  o.dir = dir_.path();
  o.world_size = 4;
  // No re-checks of their own: only the coordinator's request finds it.
  o.ckptd_args = {"--health-recheck-s", "0"};
  o.coordinator_args = {"--spare-check-max-age-s", "1"};
  o.steps_after_restore = 10;
  ASSERT_NO_FATAL_FAILURE(StartTwoNodesAndTwoSpares(o));
  ASSERT_NO_FATAL_FAILURE(BreakRoot("c"));
  auto c_before = cluster_->GetCluster();
  ASSERT_TRUE(c_before.has_value());
  for (const auto& n : c_before->nodes())
    ASSERT_FALSE(n.unhealthy()) << n.node_id() << " " << n.unhealthy_reason();
  ASSERT_NO_FATAL_FAILURE(KillBAndExpectItsRanksOnD());
  // c's failed report may come a heartbeat after d's good one.
  std::optional<cv1::NodeRecord> c;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        auto cluster = cluster_->GetCluster();
        if (cluster)
          for (const auto& n : cluster->nodes())
            if (n.node_id() == "c" && n.health_check_id() != 0) c = n;
        return c.has_value();
      },
      seconds(30)))
      << "c was never asked for a check";
  EXPECT_TRUE(c->spare());
  EXPECT_TRUE(c->unhealthy());
  EXPECT_EQ(c->unhealthy_check(), "root");
  EXPECT_NE(c->unhealthy_reason().find("Not a directory"), std::string::npos)
      << c->unhealthy_reason();
  bool waited = false;
  for (const auto& e : cluster_->Events())
    waited |= e.kind() == cv1::PLAN_WAITING &&
              e.detail().find("health check is") != std::string::npos;
  EXPECT_TRUE(waited) << "no plan waited for a spare's check";
  ASSERT_NO_FATAL_FAILURE(ExpectLaunchersFinish({"a", "d"}));

  // On demand: every alive node runs its checks and answers.
  const std::string health = Ctl("health --json --timeout-s 30");
  for (const std::string id : {"a", "c", "d"}) {
    const size_t at = health.find("\"node_id\":\"" + id + "\",\"alive\":true");
    ASSERT_NE(at, std::string::npos) << health;
    const std::string yes = "\"answered\":true";
    EXPECT_EQ(health.compare(health.find("\"answered\":", at), yes.size(), yes),
              0)
        << id << ": " << health;
  }
  EXPECT_NE(health.find("\"healthy\":false,\"check\":\"root\""),
            std::string::npos)
      << health;
  EXPECT_NE(ReadFileToString(dir_.path() + "/node-a/ckptd.log")
                .find("health: the coordinator asks for a check"),
            std::string::npos);
  // --last runs nothing: a's on-demand id stays what it was.
  auto ids = [&] {
    std::map<std::string, uint64_t> out;
    auto c = cluster_->GetCluster();
    if (c)
      for (const auto& n : c->nodes()) out[n.node_id()] = n.health_check_id();
    return out;
  };
  const auto before = ids();
  EXPECT_NE(Ctl("health --last").find("NO (root)"), std::string::npos);
  EXPECT_EQ(ids(), before);
  EXPECT_NE(Ctl("health --node zz").find("not registered"), std::string::npos);
  EXPECT_NE(Ctl("health --timeout-s 0").find("--timeout-s: 0 not in [1, 3600]"),
            std::string::npos);
}

// An idle node re-checks on its own (--health-recheck-s): spare c's root
// breaks while nothing happens in the cluster, and c's next re-check makes
// it unhealthy, without a request or a failure.
TEST_F(HealthClusterTest, IdleSpareRechecksOnItsOwn) {
  ClusterOptions o;
  o.dir = dir_.path();
  o.world_size = 2;
  o.node_ckptd_args["c"] = {"--health-recheck-s", "1"};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");
  cluster_->StartNode("c", /*spare=*/true);
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        auto cluster = cluster_->GetCluster();
        return cluster && cluster->nodes_size() == 2;
      },
      seconds(30)));
  ASSERT_NO_FATAL_FAILURE(BreakRoot("c"));
  std::optional<cv1::NodeRecord> c;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        auto cluster = cluster_->GetCluster();
        if (cluster)
          for (const auto& n : cluster->nodes())
            if (n.node_id() == "c" && n.unhealthy()) c = n;
        return c.has_value();
      },
      seconds(30)))
      << "c's re-check never reported the broken root";
  EXPECT_EQ(c->unhealthy_check(), "root");
  EXPECT_EQ(c->health_check_id(), 0u);  // its own, not a request
  EXPECT_NE(ReadFileToString(dir_.path() + "/node-c/ckptd.log")
                .find("health: re-check failed: root:"),
            std::string::npos);
}

TEST(HealthCheckCommandTest, ExitsNonZeroNamingEachFailedCheck) {
  TempDir dir;
  ASSERT_EQ(RunCommand("touch " + dir.path() + "/file").exit_code, 0);
  const std::string ckptd = CKPTD_BINARY;
  CommandResult ok =
      RunCommand(ckptd + " --health-check --json --root " + dir.path() +
                     "/root --shared-root " + dir.path() + "/shared",
                 /*with_stderr=*/false, 60);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ok.out.rfind("{\"healthy\":true,\"checks\":[", 0), 0u) << ok.out;
  CommandResult bad = RunCommand(
      ckptd + " --health-check --capacity 4 --health-shm-mib-per-rank " +
          "1073741824 --root " + dir.path() + "/file/root",
      /*with_stderr=*/true, 60);
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("ckptd: health check failed: shm, root"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("root: FAILED"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("memcpy: ok"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace ckpt::testing
