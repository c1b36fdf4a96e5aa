// The rendezvous with no single point of failure, with real processes:
// ckpt-worker ranks under real ckptruns (--rendezvous auto: worker), which
// serve every generation's store from their start; the trainers are its
// clients only. Rank 0's node is lost: the job recovers like any node
// loss, one plan, the survivors keeping their processes, the ending bit
// for bit the undisturbed run's. Rank 0's trainer is SIGKILLed: the
// survivors re-form on the same store server, never restarted.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/cluster_fixture.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

constexpr uint32_t kWorld = 4;

// The small model of these tests; a declared evaluation of 30 ms a step
// (the weights untouched) leaves time to act while it trains.
std::vector<std::string> WorkerFlags() {
  return SmallWorkerFlags(80, 2,
                          {"--eval-every", "1", "--eval-s", "0.03",
                           "--collective-timeout-s", "90"});
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

class RendezvousTest : public ClusterTest {
 protected:
  // The digest of the same 4 ranks undisturbed.
  std::string Reference() {
    std::vector<std::string> argv = {CKPT_WORKER_BINARY};
    for (const std::string& f : WorkerFlags()) argv.push_back(f);
    return WorkerReference(argv, kWorld);
  }

  void StartCluster(bool spare) {
    ClusterOptions o = Options(kWorld);
    o.trainer_command = {CKPT_WORKER_BINARY};
    for (const std::string& f : WorkerFlags()) o.trainer_command.push_back(f);
    cluster_ = std::make_unique<Cluster>(o);
    cluster_->StartCoordinator();
    cluster_->StartNode("a");  // ranks 0, 1
    cluster_->StartNode("b");  // ranks 2, 3
    if (spare) cluster_->StartNode("c", /*spare=*/true);
  }

  // Every rank ended with the undisturbed run's weights.
  void ExpectBitIdentical(const std::string& logs, const std::string& want) {
    std::map<uint32_t, std::string> digests = WorkerDoneDigests(logs);
    EXPECT_EQ(digests.size(), kWorld) << logs;
    for (const auto& [rank, digest] : digests)
      EXPECT_EQ(digest, want) << "rank " << rank;
  }
};

// Node a, rank 0's, dies with its ckptd, its ckptrun (which may be the one
// serving the host's store: the test's nodes share one host) and its
// trainers. One plan moves ranks 0 and 1 to the spare c; the ranks on b
// keep their processes and re-form on the store that a live ckptrun
// serves, not on one a new rank 0 must bring up first.
TEST_F(RendezvousTest, RankZerosNodeLostRecoversLikeAnyNodeSurvivorsKept) {
  const std::string want = Reference();
  StartCluster(/*spare=*/true);
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(6));
  cluster_->KillNode("a");
  ExpectLaunchersSucceed({"b", "c"});
  const std::string b = cluster_->LauncherLog("b");
  const std::string c = cluster_->LauncherLog("c");
  auto job = cluster_->Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->generation(), 1u) << "one plan for one failure\n" << b;
  EXPECT_EQ(job->rank_node(0), "c");
  EXPECT_EQ(job->rank_node(1), "c");
  for (uint32_t r : {2u, 3u})
    EXPECT_NE(b.find(absl::StrCat("generation 1: rank ", r,
                                  " keeps its process (in-process restart)")),
              std::string::npos)
        << b;
  EXPECT_EQ(Count(b, "start ranks"), 1u) << "b's trainers were restarted\n"
                                         << b;
  // The store of generation 1 was served by a ckptrun of a live node from
  // its start (rank 0's new trainer, a client only, would fail to serve it
  // on the port the ckptrun holds).
  EXPECT_GE(Count(b + c, "serving the rendezvous store (worker)"), 1u)
      << b << c;
  ExpectBitIdentical(b + c, want);
}

// Rank 0's trainer is SIGKILLed: ranks 1-3 keep their processes and
// re-form, with rank 0's new process, on the store the job had from the
// start: one server, never started again.
TEST_F(RendezvousTest, RankZerosTrainerKilledSurvivorsReformOnTheSameStore) {
  const std::string want = Reference();
  StartCluster(/*spare=*/false);
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(6));
  const pid_t victim = cluster_->WorkerPid(0, "a");
  ASSERT_GT(victim, 0) << cluster_->LauncherLog("a");
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ExpectLaunchersSucceed({"a", "b"});
  const std::string a = cluster_->LauncherLog("a");
  const std::string b = cluster_->LauncherLog("b");
  EXPECT_NE(a.find("generation 1: rank 1 keeps its process"), std::string::npos)
      << a;
  for (uint32_t r : {2u, 3u})
    EXPECT_NE(b.find(absl::StrCat("generation 1: rank ", r,
                                  " keeps its process (in-process restart)")),
              std::string::npos)
        << b;
  // One store until the survivors re-formed: every rank joined generation
  // 1 before a's ranks could finish. (Once a's ckptrun is done and gone,
  // b's, on this same host, may take the free port over: the tests' nodes
  // share one host, where real ones do not.)
  const std::string joined = "joined (in-process restart)";
  const size_t a_joined = a.rfind(joined);
  const size_t b_joined = b.rfind(joined);
  ASSERT_NE(a_joined, std::string::npos) << a;
  ASSERT_NE(b_joined, std::string::npos) << b;
  EXPECT_EQ(Count(a.substr(0, a_joined) + b.substr(0, b_joined),
                  "serving the rendezvous store (worker)"),
            1u)
      << a << b;
  ExpectBitIdentical(a + b, want);
}

}  // namespace
}  // namespace ckpt::testing
