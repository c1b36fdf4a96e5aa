// Generations of a job launched without ckptrun (torchrun and the ckpt
// package): its trainers carry no CKPT_GENERATION, so the coordinator
// tells a trainer of an abandoned timeline from a restarted one by when
// the process started. Real coordinator and ckptd processes; the test
// starts the trainers itself, as torchrun would (no ckptrun, no
// CKPT_GENERATION), and kills them with real signals.
//   - A trainer that started before the failure and keeps saving after
//     the plan is a zombie: ckptd's reports of its saves are refused,
//     naming its generation, and no step commits from it.
//   - A trainer started after the failure (by torchrun, even before the
//     coordinator planned for it) saves and its steps commit.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cluster_fixture.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

constexpr uint64_t kBytes = 1 << 20;

class GenerationClusterTest : public ClusterTest {
 protected:
  // Nodes a and b host ranks 0 and 1; c is the spare. No ckptrun: the job
  // is registered here and the trainers are started by Trainer().
  void SetUp() override {
    ClusterOptions o = Options(2);
    o.nproc_per_node = 1;
    o.launcher = false;
    cluster_ = std::make_unique<Cluster>(o);
    cluster_->StartCoordinator();
    cluster_->StartNode("a");
    cluster_->StartNode("b");
    cluster_->StartNode("c", /*spare=*/true);
    cv1::RegisterJobRequest req;
    req.set_job("job");
    req.set_world_size(2);
    req.set_nproc_per_node(1);
    cv1::RegisterJobResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = cluster_->Stub()->RegisterJob(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(resp.job().rank_node_size(), 2);
    ASSERT_EQ(resp.job().rank_node(0), "a");
    ASSERT_EQ(resp.job().rank_node(1), "b");
  }

  // A cluster_trainer of `rank` on `node`, as torchrun starts one: the
  // job, rank, world and socket in its environment, no generation. Its
  // log is <dir>/<name>/rank-<rank>.log.
  std::unique_ptr<Proc> Trainer(const std::string& name,
                                const std::string& node, uint32_t rank,
                                int step_ms, uint64_t last_step,
                                std::optional<uint64_t> restore = {}) {
    const std::string logs = dir_.path() + "/" + name;
    std::filesystem::create_directories(logs);
    std::vector<std::string> env = {
        "CKPT_SOCKET=" + cluster_->Socket(node), "CKPT_JOB=job",
        "RANK=" + std::to_string(rank), "WORLD_SIZE=2", "LOCAL_RANK=0"};
    if (restore) env.push_back("CKPT_RESTORE_STEP=" + std::to_string(*restore));
    return Proc::Spawn(
        {CLUSTER_TRAINER_BINARY, std::to_string(kBytes),
         std::to_string(last_step), std::to_string(step_ms), logs, "hold"},
        logs + "/out.log", env);
  }
  // The newest step the trainer `name` of `rank` logged as saved (0: none).
  uint64_t Saved(const std::string& name, uint32_t rank) const {
    std::ifstream in(dir_.path() + "/" + name + "/rank-" +
                     std::to_string(rank) + ".log");
    uint64_t step = 0;
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("saved step=", 0) == 0)
        step = std::stoull(line.substr(sizeof("saved step=") - 1));
    return step;
  }
  std::optional<cv1::Event> PlanMade() const {
    for (const auto& e : cluster_->Events())
      if (e.kind() == cv1::PLAN_MADE) return e;
    return std::nullopt;
  }
  // The plan that moved rank 0 to c is acknowledged; its restore step.
  uint64_t WaitForPlan() {
    uint64_t step = 0;
    EXPECT_TRUE(Cluster::WaitUntil(
        [&] {
          auto job = cluster_->Job();
          if (!job || job->generation() != 1 ||
              job->plan_state() != cv1::PLAN_ACKNOWLEDGED)
            return false;
          step = job->restore_step();
          return job->has_restore_step() && job->rank_node(0) == "c";
        },
        seconds(60)))
        << "no acknowledged plan moving rank 0 to c";
    return step;
  }
  // The line of b's ckptd log that says the coordinator refused its
  // STAGED report of rank 1's `step`, or "" when there is none (yet).
  std::string Refusal(uint64_t step) const {
    std::istringstream in(DaemonLog("b"));
    const std::string what =
        "report staged job job step " + std::to_string(step) + " rank 1 ";
    std::string line;
    while (std::getline(in, line))
      if (line.find(what) != std::string::npos) return line;
    return "";
  }
};

// A trainer of generation 0 on b (started before a died) that keeps
// saving after the plan is a zombie: ckptd's reports of its saves are
// refused, naming generation 0, and no step commits from it while it is
// rank 1's only trainer, though rank 0's new trainer saves the same
// steps. Once it is replaced by a trainer started after the failure,
// steps commit again.
TEST_F(GenerationClusterTest, ZombieOfTheOldGenerationIsDropped) {
  auto t0 = Trainer("t0", "a", 0, 100, 100000);
  auto zombie = Trainer("zombie", "b", 1, 150, 100000);
  WaitForProgress(3);
  ASSERT_FALSE(HasFatalFailure());
  // Seconds old when a dies: well before the failure, whatever the load.
  ASSERT_TRUE(Cluster::WaitUntil([&] { return Saved("zombie", 1) >= 20; },
                                 seconds(60)));
  // a dies with its trainer. The zombie never notices (torchrun would
  // restart it only once a collective failed).
  t0->Kill();
  cluster_->KillNode("a");
  const uint64_t restore = WaitForPlan();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_GE(restore, 3u);
  // Every save the zombie logs from here on was committed after the plan
  // (one more step for a save whose log line was still being written).
  const uint64_t after_plan = Saved("zombie", 1) + 2;
  // Rank 0's new trainer on c (started after the failure) restores and
  // saves fast: it reaches the zombie's steps and saves them too.
  auto t0b = Trainer("t0b", "c", 0, 20, after_plan + 40, restore);
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] { return !Refusal(after_plan).empty() || LastGood() > restore; },
      seconds(60)))
      << "the zombie's report of step " << after_plan
      << " was neither refused nor did a step commit";
  EXPECT_EQ(LastGood(), restore)
      << "step " << LastGood()
      << " committed with rank 1's shard saved by a trainer of the abandoned "
         "generation 0";
  const std::string refusal = Refusal(after_plan);
  EXPECT_NE(refusal.find("generation 0"), std::string::npos) << refusal;
  // Nothing stalls: the zombie's replacement, started after the failure,
  // saves and its steps commit.
  zombie->Kill();
  auto t1b = Trainer("t1b", "b", 1, 20, after_plan + 40, restore);
  EXPECT_TRUE(
      Cluster::WaitUntil([&] { return LastGood() > restore; }, seconds(60)))
      << "no step committed after the zombie was replaced (last good "
      << LastGood() << ")";
}

// torchrun restarts the surviving node's trainer on its own, before the
// coordinator has planned for the failure: a trainer started after the
// failure is never taken for a zombie, so its saves after the plan count
// and steps commit.
TEST_F(GenerationClusterTest, TrainerRestartedBeforeThePlanCommits) {
  auto t0 = Trainer("t0", "a", 0, 100, 4);
  auto t1 = Trainer("t1", "b", 1, 100, 4);
  WaitForProgress(4);
  ASSERT_FALSE(HasFatalFailure());
  t0->Kill();
  cluster_->KillNode("a");
  t1->Kill();
  ASSERT_EQ(cluster_->Job()->generation(), 0u)
      << "the coordinator planned before the trainer was restarted";
  auto t1b = Trainer("t1b", "b", 1, 150, 100000, 4);
  const uint64_t restore = WaitForPlan();
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_EQ(restore, 4u);
  auto t0b = Trainer("t0b", "c", 0, 20, 100000, restore);
  EXPECT_TRUE(
      Cluster::WaitUntil([&] { return LastGood() > restore; }, seconds(60)))
      << "no step committed from the trainers started after the failure (last "
         "good "
      << LastGood() << ", rank 1 saved up to " << Saved("t1b", 1) << ")";
}

}  // namespace
}  // namespace ckpt::testing
