// ckpt-worker as a real child process against a real ckptd: a run stopped or
// SIGKILLed and resumed from its checkpoints ends with the same weights, bit
// for bit, as one uninterrupted run; a checkpoint of another model is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/daemon_test.h"
#include "tests/harness.h"
#include "worker/worker_process.h"

namespace ckpt::testing {
namespace {

using ckpt::worker::testing::WorkerProcess;
using RunResult = ckpt::worker::testing::WorkerRun;

// One real ckptd per test (tests/daemon_test.h).
class WorkerResumeTest : public ckpt::testing::DaemonTest {
 protected:
  // Runs ckpt-worker with the small model; with kill_at, SIGKILLs it as soon
  // as it prints the loss of that step.
  RunResult Run(std::vector<std::string> args, const std::string& job,
                std::map<std::string, std::string> env = {},
                std::optional<int> kill_at = std::nullopt,
                bool with_daemon = true) {
    if (with_daemon) {
      env["CKPT_SOCKET"] = daemon_->socket();
      env["CKPT_JOB"] = job;
    }
    std::optional<std::string> kill_line;
    if (kill_at) kill_line = "step " + std::to_string(*kill_at) + " loss";
    return WorkerProcess::Start(args, env, kill_line)->Wait();
  }
};

TEST_F(WorkerResumeTest, StoppedAndResumedRunEndsWithTheSameDigest) {
  RunResult straight =
      Run({"--steps", "40"}, "straight", {}, std::nullopt, false);
  ASSERT_TRUE(straight.exited_ok()) << straight.output;
  ASSERT_EQ(straight.Digest().size(), 16u) << straight.output;

  RunResult first = Run({"--steps", "20", "--ckpt-every", "1"}, "stopped");
  ASSERT_TRUE(first.exited_ok()) << first.output;
  EXPECT_NE(first.Digest(), straight.Digest());
  RunResult second = Run({"--steps", "40", "--ckpt-every", "1"}, "stopped");
  ASSERT_TRUE(second.exited_ok()) << second.output;
  EXPECT_NE(second.output.find("restored step 20"), std::string::npos)
      << second.output;
  EXPECT_EQ(second.output.find("step 20 loss"), std::string::npos)
      << second.output;
  EXPECT_EQ(second.Digest(), straight.Digest()) << second.output;
}

TEST_F(WorkerResumeTest,
       KilledRunResumesFromItsLatestCheckpointWithTheSameDigest) {
  RunResult straight =
      Run({"--steps", "200"}, "straight", {}, std::nullopt, false);
  ASSERT_TRUE(straight.exited_ok()) << straight.output;

  RunResult killed =
      Run({"--steps", "200", "--ckpt-every", "1"}, "killed", {}, 30);
  ASSERT_TRUE(WIFSIGNALED(killed.status) && WTERMSIG(killed.status) == SIGKILL)
      << "the worker finished before it was killed:\n"
      << killed.output;
  RunResult resumed = Run({"--steps", "200", "--ckpt-every", "1"}, "killed");
  ASSERT_TRUE(resumed.exited_ok()) << resumed.output;
  EXPECT_NE(resumed.output.find("restored step"), std::string::npos)
      << resumed.output;
  EXPECT_EQ(resumed.Digest(), straight.Digest()) << resumed.output;
}

TEST_F(WorkerResumeTest, RestoresTheStepNamedByCkptRestoreStep) {
  RunResult first = Run({"--steps", "20", "--ckpt-every", "4"}, "named");
  ASSERT_TRUE(first.exited_ok()) << first.output;
  // Back to step 16 of a job whose latest step is 20, and on to 20 again.
  RunResult again =
      Run({"--steps", "20"}, "named", {{"CKPT_RESTORE_STEP", "16"}});
  ASSERT_TRUE(again.exited_ok()) << again.output;
  EXPECT_NE(again.output.find("restored step 16"), std::string::npos)
      << again.output;
  EXPECT_NE(again.output.find("step 17 loss"), std::string::npos)
      << again.output;
  EXPECT_EQ(again.Digest(), first.Digest()) << again.output;
}

TEST_F(WorkerResumeTest, CheckpointOfAnotherModelSizeIsRefusedBeforeTraining) {
  RunResult first = Run({"--steps", "3", "--ckpt-every", "1"}, "resized");
  ASSERT_TRUE(first.exited_ok()) << first.output;
  RunResult wider =
      Run({"--steps", "6", "--ckpt-every", "1", "--dim", "48"}, "resized");
  EXPECT_EQ(WEXITSTATUS(wider.status), 1) << wider.output;
  EXPECT_NE(wider.output.find("dim = 32, this run has dim = 48"),
            std::string::npos)
      << wider.output;
  EXPECT_EQ(wider.output.find("step 4 loss"), std::string::npos)
      << wider.output;
  RunResult deeper = Run({"--steps", "6", "--layers", "3"}, "resized");
  EXPECT_EQ(WEXITSTATUS(deeper.status), 1) << deeper.output;
  EXPECT_NE(deeper.output.find("layers = 2, this run has layers = 3"),
            std::string::npos)
      << deeper.output;
}

TEST_F(WorkerResumeTest, BadConfigurationExitsWithAClearError) {
  RunResult r = Run({"--steps", "3", "--offload-fraction", "1.5"}, "bad");
  EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.output;
  EXPECT_NE(r.output.find("offload_fraction = 1.5"), std::string::npos)
      << r.output;
  r = Run({"--steps", "3", "--batch", "7"}, "bad",
          {{"WORLD_SIZE", "2"}, {"RANK", "0"}});
  EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.output;
  EXPECT_NE(
      r.output.find(
          "batch = 7: the global batch must split evenly over world_size 2"),
      std::string::npos)
      << r.output;
  r = Run({"--steps", "3"}, "bad", {{"CKPT_RESTORE_STEP", "2"}});
  EXPECT_EQ(WEXITSTATUS(r.status), 1) << r.output;
  EXPECT_NE(r.output.find("checkpoint step 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ckpt::testing
