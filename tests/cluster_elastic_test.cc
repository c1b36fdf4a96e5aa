// Elastic continuation with real processes: ckpt-worker ranks under real
// ckptruns (--min-world-size 2), a real coordinator and ckptds, no spare.
// Node a (ranks 0 and 1) is SIGKILLed with its ckptd, ckptrun and
// trainers: the job goes on at world size 2 on node b, whose new ranks 0
// and 1 restore saved ranks 2 and 3 of the last good step from b's own
// memory, and ends bit for bit as a reference that made the same shrink
// at the same step from the same checkpoint: 4 ranks trained to that step
// against a standalone ckptd, then 2 ranks restoring saved ranks 2 and 3
// of it (the same code, no failure, no coordinator). Node a started again
// grows the job back to 4 ranks at its next commit, bit for bit as the
// reference that shrank and grew at the same steps.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster_fixture.h"
#include "tests/harness.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;

constexpr uint32_t kWorld = 4;
constexpr uint32_t kShrunk = 2;
constexpr int kSteps = 60;
// Long enough that the shrunk job still trains once node a is back.
constexpr int kLongSteps = 160;

// The small model of these tests; a declared evaluation of 30 ms a step
// (the weights untouched: the reference runs without it) leaves time to
// act while the cluster trains.
std::vector<std::string> WorkerFlags(int steps, bool paced = true,
                                     bool zero1 = false) {
  std::vector<std::string> f =
      SmallWorkerFlags(steps, 2, {"--collective-timeout-s", "90"});
  if (paced) f.insert(f.end(), {"--eval-every", "1", "--eval-s", "0.03"});
  if (zero1) f.push_back("--zero1");
  return f;
}

class ElasticClusterTest : public ClusterTest {
 protected:
  void GrowsBackAfterItsNodeReturns(bool zero1);
  // `world` ckpt-worker ranks of `flags` against `daemon`, job `job`,
  // with `env` (per rank) added; every one must exit 0. Returns the log.
  std::string RunRanks(const DaemonProcess& daemon, const std::string& job,
                       const std::vector<std::string>& flags, uint32_t world,
                       const std::string& name,
                       std::vector<std::vector<std::string>> env = {}) {
    const int port = FreeLoopbackPorts(1)[0];
    const std::string log = dir_.path() + "/" + name + ".log";
    std::vector<std::string> argv = {CKPT_WORKER_BINARY};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<std::unique_ptr<Proc>> ranks;
    for (uint32_t r = 0; r < world; ++r) {
      std::vector<std::string> e = {"RANK=" + std::to_string(r),
                                    "WORLD_SIZE=" + std::to_string(world),
                                    "MASTER_ADDR=127.0.0.1",
                                    "MASTER_PORT=" + std::to_string(port),
                                    "CKPT_SOCKET=" + daemon.socket(),
                                    "CKPT_JOB=" + job};
      if (r < env.size()) e.insert(e.end(), env[r].begin(), env[r].end());
      ranks.push_back(Proc::Spawn(argv, log, e));
    }
    for (auto& p : ranks) {
      std::optional<int> st = p->Wait(std::chrono::seconds(120));
      EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << ReadFileToString(log);
    }
    return ReadFileToString(log);
  }

  // One stretch of the reference: `world` ranks train to `steps`, rank i
  // restoring saved rank from[i] of `restore` (saved at `saved_world`)
  // unless it is the first.
  struct Stretch {
    uint32_t world = 0;
    int steps = 0;
    uint64_t restore = 0;
    uint32_t saved_world = 0;
    std::vector<uint32_t> from;
  };
  // The reference: the stretches one after the other against one
  // standalone ckptd, the same code without a failure; the digest the
  // last one's ranks end with. zero1: the workers run --zero1 (each rank
  // reshards its slice; the saved ranks in `from` are not used).
  std::string Reference(const std::vector<Stretch>& stretches,
                        bool zero1 = false) {
    std::filesystem::create_directories(dir_.path() + "/ref-run");
    auto daemon = DaemonProcess::Start(
        dir_.path() + "/ref-root", dir_.path() + "/ref-run", prefixes_.New());
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    if (!daemon.ok()) return "";
    std::string log;
    for (size_t k = 0; k < stretches.size(); ++k) {
      const Stretch& st = stretches[k];
      // Each stretch a generation of its own, as a launcher's plan: a job
      // changes its world size only under a newer one.
      std::vector<std::vector<std::string>> env(
          st.world, {absl::StrCat("CKPT_GENERATION=", k)});
      for (size_t r = 0; r < st.from.size(); ++r)
        env[r].insert(
            env[r].end(),
            {absl::StrCat("CKPT_RESTORE_STEP=", st.restore),
             absl::StrCat("CKPT_RESTORE_RANK=", st.from[r]),
             absl::StrCat("CKPT_RESTORE_WORLD_SIZE=", st.saved_world)});
      log = RunRanks(**daemon, "ref", WorkerFlags(st.steps, false, zero1),
                     st.world, absl::StrCat("reference-", k), env);
      if (k > 0) {
        EXPECT_NE(log.find(absl::StrCat("restored step ", st.restore)),
                  std::string::npos)
            << log;
      }
    }
    std::map<uint32_t, std::string> d = WorkerDoneDigests(log);
    EXPECT_EQ(d.size(), stretches.back().world) << log;
    std::set<std::string> distinct;
    for (const auto& [rank, digest] : d) distinct.insert(digest);
    EXPECT_EQ(distinct.size(), 1u) << log;
    return d.empty() ? "" : d.begin()->second;
  }

  ArenaPrefixes prefixes_;  // the reference's ckptd's arenas
};

TEST_F(ElasticClusterTest, NodeLostWithoutSpareTrainsOnAtTheSmallerWorldSize) {
  ClusterOptions o = Options(kWorld);
  o.trainer_command = {CKPT_WORKER_BINARY};
  for (const std::string& f : WorkerFlags(kSteps))
    o.trainer_command.push_back(f);
  o.launcher_args = {"--min-world-size", std::to_string(kShrunk)};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");  // ranks 0, 1
  cluster_->StartNode("b");  // ranks 2, 3
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(6));
  cluster_->KillNode("a");
  ExpectLaunchersSucceed({"b"});
  const std::string b = cluster_->LauncherLog("b");
  auto job = cluster_->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->world_size(), kShrunk) << b;
  EXPECT_EQ(job->full_world_size(), kWorld);
  EXPECT_EQ(job->rank_node(0), "b");
  EXPECT_EQ(job->rank_node(1), "b");
  ASSERT_TRUE(job->has_restore_step());
  const uint64_t step = job->restore_step();
  EXPECT_EQ(job->restore_world_size(), kWorld);
  const std::vector<uint32_t> from(job->restore_ranks().begin(),
                                   job->restore_ranks().end());
  EXPECT_EQ(from, (std::vector<uint32_t>{2, 3})) << "b's own memory";
  // PLAN_MADE says the world size; the shrunk job committed steps after.
  bool shrunk = false;
  for (const cv1::Event& e : cluster_->Events())
    if (e.kind() == cv1::PLAN_MADE && e.world_size() == kShrunk) shrunk = true;
  EXPECT_TRUE(shrunk);
  EXPECT_GT(job->last_good_step(), step);
  EXPECT_EQ(job->last_good_world_size(), kShrunk);
  // Each new rank restored its saved rank from b's memory and finished.
  EXPECT_NE(b.find(absl::StrCat("restored step ", step)), std::string::npos)
      << b;
  std::map<uint32_t, std::string> digests = WorkerDoneDigests(b);
  ASSERT_EQ(digests.count(0) + digests.count(1), 2u) << b;
  const std::string want =
      Reference({{kWorld, static_cast<int>(step), 0, 0, {}},
                 {kShrunk, kSteps, step, kWorld, from}});
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(digests[0], want);
  EXPECT_EQ(digests[1], want);
}

// ZeRO-1 (--zero1): each rank holds and saves only its slice of the
// optimizer state, so the pieces of node a's ranks are gone with it. The
// shrunk job's ranks on b restore the last good step (durable in the
// shared root) resharded: each asks for its new, twice as large slice,
// and b's ckptd serves a's ranks' pieces from the shared root, its own
// from memory. The ending is bit for bit the reference's that shrank at
// the same step (4 ranks to it, then 2 resharding it), which is also
// plain data parallel's.
TEST_F(ElasticClusterTest, Zero1JobLosingANodeReshardsOntoTheRanksLeft) {
  ClusterOptions o = Options(kWorld);
  o.trainer_command = {CKPT_WORKER_BINARY};
  for (const std::string& f : WorkerFlags(kSteps, true, /*zero1=*/true))
    o.trainer_command.push_back(f);
  o.launcher_args = {"--min-world-size", std::to_string(kShrunk)};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");  // ranks 0, 1
  cluster_->StartNode("b");  // ranks 2, 3
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(6));
  cluster_->KillNode("a");
  ExpectLaunchersSucceed({"b"});
  const std::string b = cluster_->LauncherLog("b");
  auto job = cluster_->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->world_size(), kShrunk) << b;
  ASSERT_TRUE(job->has_restore_step());
  const uint64_t step = job->restore_step();
  EXPECT_EQ(job->restore_world_size(), kWorld);
  EXPECT_GT(job->last_good_step(), step);
  EXPECT_NE(b.find(absl::StrCat("restored step ", step)), std::string::npos)
      << b;
  EXPECT_NE(b.find("zero1 rank 1 of 2 owns elements ["), std::string::npos)
      << b;
  std::map<uint32_t, std::string> digests = WorkerDoneDigests(b);
  ASSERT_EQ(digests.count(0) + digests.count(1), 2u) << b;
  const std::string want =
      Reference({{kWorld, static_cast<int>(step), 0, 0, {}},
                 {kShrunk, kSteps, step, kWorld, {0, 0}}},
                /*zero1=*/true);
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(digests[0], want);
  EXPECT_EQ(digests[1], want);
}

// Node a comes back (a new ckptd and ckptrun) while the shrunk job trains:
// nothing restarts until the job's next commit, where one plan grows it
// back to 4 ranks (a's new ranks 2 and 3 restoring saved ranks 0 and 1 of
// that step, fetched), and the ending is bit for bit the reference's that
// shrank and grew at the same steps. zero1: the workers run --zero1, so
// the grown ranks reshard their slices from the two saved ranks, on a
// node whose ckptd still holds the abandoned 4-rank timeline's shards of
// the same step numbers (ranks 2 and 3 were b's before the shrink).
void ElasticClusterTest::GrowsBackAfterItsNodeReturns(bool zero1) {
  ClusterOptions o = Options(kWorld);
  o.trainer_command = {CKPT_WORKER_BINARY};
  for (const std::string& f : WorkerFlags(kLongSteps, /*paced=*/true, zero1))
    o.trainer_command.push_back(f);
  o.launcher_args = {"--min-world-size", std::to_string(kShrunk)};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");
  cluster_->StartNode("b");
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(6));
  cluster_->KillNode("a");
  std::optional<cv1::JobRecord> shrunk;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        shrunk = cluster_->Job();
        return shrunk && shrunk->world_size() == kShrunk;
      },
      std::chrono::seconds(60)));
  const uint64_t shrink_step = shrunk->restore_step();
  const std::vector<uint32_t> shrink_from(shrunk->restore_ranks().begin(),
                                          shrunk->restore_ranks().end());
  cluster_->StartNode("a");
  ExpectLaunchersSucceed({"a", "b"});
  auto job = cluster_->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->world_size(), kWorld);
  EXPECT_EQ(job->rank_node(2), "a");
  EXPECT_EQ(job->rank_node(3), "a");
  const uint64_t grow_step = job->restore_step();
  EXPECT_GT(grow_step, shrink_step);
  EXPECT_EQ(job->restore_world_size(), kShrunk);
  const std::vector<uint32_t> grow_from(job->restore_ranks().begin(),
                                        job->restore_ranks().end());
  EXPECT_EQ(grow_from, (std::vector<uint32_t>{0, 1, 0, 1}));
  bool grown = false;
  for (const cv1::Event& e : cluster_->Events())
    if (e.kind() == cv1::PLAN_MADE && e.world_size() == kWorld &&
        e.detail().find("grown from world size 2 to 4") != std::string::npos)
      grown = true;
  EXPECT_TRUE(grown);
  std::map<uint32_t, std::string> digests = WorkerDoneDigests(
      cluster_->LauncherLog("a") + cluster_->LauncherLog("b"));
  ASSERT_EQ(digests.size(), kWorld);
  const std::string want = Reference(
      {{kWorld, static_cast<int>(shrink_step), 0, 0, {}},
       {kShrunk, static_cast<int>(grow_step), shrink_step, kWorld, shrink_from},
       {kWorld, kLongSteps, grow_step, kShrunk, grow_from}},
      zero1);
  ASSERT_FALSE(want.empty());
  for (const auto& [rank, digest] : digests)
    EXPECT_EQ(digest, want) << "rank " << rank;
}

TEST_F(ElasticClusterTest, ReturnedNodeGrowsTheJobBackAtItsNextCommit) {
  GrowsBackAfterItsNodeReturns(/*zero1=*/false);
}

TEST_F(ElasticClusterTest, Zero1JobGrowsBackWhenItsNodeReturns) {
  GrowsBackAfterItsNodeReturns(/*zero1=*/true);
}

}  // namespace
}  // namespace ckpt::testing
