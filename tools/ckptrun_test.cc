// Runs the real ckptrun binary against the real ckpt-coordinator binary,
// with /bin/sh trainers that write their environment to a file: the
// environment each rank gets, a failed rank reported and the job restarted
// in the coordinator's next generation, a clean finish, and bad flags.
#include "storage/shard_format.h"
#include "tools/ckptrun_fixture.h"

namespace ckpt::tools {
namespace {

TEST_F(CkptrunTest, StartsOneTrainerPerRankWithTorchrunEnvironment) {
  testing::FakeNode node(coord_->address(), "n1", "10.1.2.3:50051", 2);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  StartCkptrun("sleep", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  for (uint32_t r : {0u, 1u}) {
    auto env = Env(0, r);
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["CKPT_JOB"], "train");
    EXPECT_EQ(env["CKPT_SOCKET"], "/run/ckptd-test.sock");
    EXPECT_EQ(env["CKPT_GENERATION"], "0");
    EXPECT_EQ(env["MASTER_ADDR"], "10.1.2.3");  // rank 0's node, port removed
    EXPECT_EQ(env["MASTER_PORT"], "31000");
    EXPECT_EQ(env.count("CKPT_RESTORE_STEP"), 0u)
        << "a fresh job has nothing to restore";
  }
  // SIGTERM stops the trainers and ckptrun exits 128+15.
  kill(ckptrun_, SIGTERM);
  EXPECT_EQ(WaitCkptrun(milliseconds(10000)), 143);
  EXPECT_TRUE(Dead(Env(0, 0)["PID"]));
  EXPECT_TRUE(Dead(Env(0, 1)["PID"]));
}

// What ckptrun sets for a trainer is never passed on from its own
// environment: a CKPT_WARM=1 left there (say, by a script that started
// ckptrun from inside a warm trainer's shell) would make every fresh
// trainer wait for a plan it was already given.
TEST_F(CkptrunTest, VariablesCkptrunSetsAreNeverInheritedFromItsEnvironment) {
  testing::FakeNode node(coord_->address(), "n1", "10.1.2.3:50051", 2);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  ASSERT_EQ(setenv("CKPT_WARM", "1", 1), 0);
  ASSERT_EQ(setenv("CKPT_RENDEZVOUS", "launcher", 1), 0);
  ASSERT_EQ(setenv("CKPT_STACKS_FILE", "/nonexistent/stacks", 1), 0);
  StartCkptrun("sleep", 2);
  unsetenv("CKPT_WARM");
  unsetenv("CKPT_RENDEZVOUS");
  unsetenv("CKPT_STACKS_FILE");
  ASSERT_TRUE(WaitForEnv(0, {0, 1})) << ReadFile(log());
  for (uint32_t r : {0u, 1u}) {
    auto env = Env(0, r);
    EXPECT_EQ(env.count("CKPT_WARM"), 0u) << "rank " << r;
    EXPECT_EQ(env.count("CKPT_RENDEZVOUS"), 0u) << "rank " << r;
    EXPECT_NE(env["CKPT_STACKS_FILE"], "/nonexistent/stacks") << "rank " << r;
  }
  kill(ckptrun_, SIGTERM);
  EXPECT_EQ(WaitCkptrun(milliseconds(10000)), 143);
}

TEST_F(CkptrunTest, TrainersDieWhenCkptrunIsKilled) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("sleep", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  // The killed ckptrun cannot remove its stacks directory: the fixture
  // gives it a TMPDIR in the test's directory, not /tmp.
  EXPECT_EQ(Env(0, 0)["CKPT_STACKS_FILE"].rfind(dir_.path() + "/", 0), 0u)
      << Env(0, 0)["CKPT_STACKS_FILE"];
  kill(ckptrun_, SIGKILL);
  EXPECT_EQ(WaitCkptrun(milliseconds(5000)), 128 + SIGKILL);
  std::string pid0 = Env(0, 0)["PID"], pid1 = Env(0, 1)["PID"];
  EXPECT_TRUE(
      WaitFor([&] { return Dead(pid0) && Dead(pid1); }, milliseconds(5000)));
}

// `ckptrun -- sh -c ./train.sh`: the real trainer is a child
// of the wrapper, which PR_SET_PDEATHSIG does not reach. SIGKILL of ckptrun
// must still leave no trainer process behind (checked in /proc).
TEST_F(CkptrunTest, TrainersUnderAWrapperDieWhenCkptrunIsKilled) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("wrapped", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  auto child = [&](uint32_t rank) {
    std::string pid = ReadFile(dir_.path() + "/child-" + std::to_string(rank));
    while (!pid.empty() && pid.back() == '\n') pid.pop_back();
    return pid;
  };
  ASSERT_TRUE(WaitFor([&] { return !child(0).empty() && !child(1).empty(); },
                      milliseconds(10000)));
  const std::string wrapper0 = Env(0, 0)["PID"], wrapper1 = Env(0, 1)["PID"];
  const std::string real0 = child(0), real1 = child(1);
  ASSERT_FALSE(Dead(real0));
  kill(ckptrun_, SIGKILL);
  EXPECT_EQ(WaitCkptrun(milliseconds(5000)), 128 + SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return Dead(wrapper0) && Dead(wrapper1); },
                      milliseconds(5000)));
  EXPECT_TRUE(
      WaitFor([&] { return Dead(real0) && Dead(real1); }, milliseconds(5000)))
      << "the trainers under the wrappers survived ckptrun";
  for (const std::string& pid : {real0, real1})
    if (!Dead(pid)) kill(std::stoi(pid), SIGKILL);
}

// A wrapper that exits on its own leaves its child to ckptrun (a child
// subreaper), which kills the trainer's whole group and reports the exit.
TEST_F(CkptrunTest, StopKillsWhatEachTrainerForked) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("wrapped", 1);
  ASSERT_TRUE(WaitForEnv(0, {0}));
  std::string real;
  ASSERT_TRUE(WaitFor(
      [&] {
        real = ReadFile(dir_.path() + "/child-0");
        return !real.empty();
      },
      milliseconds(10000)));
  while (!real.empty() && real.back() == '\n') real.pop_back();
  kill(ckptrun_, SIGTERM);
  EXPECT_EQ(WaitCkptrun(milliseconds(10000)), 143);
  EXPECT_TRUE(WaitFor([&] { return Dead(real); }, milliseconds(5000)));
  if (!Dead(real)) kill(std::stoi(real), SIGKILL);
}

TEST_F(CkptrunTest,
       FailedRankIsReportedAndJobRestartsFromDurableStepInNextGeneration) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("fail1", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  EXPECT_EQ(Env(0, 0)["MASTER_ADDR"],
            "127.0.0.1");  // rank 0's node has no address
  for (auto state : {cv1::STAGED, cv1::DURABLE})
    for (uint32_t r : {0u, 1u}) {
      grpc::Status s = node.ReportShard("train", 7, r, state,
                                        storage::ShardKey("train", 7, r));
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  std::ofstream(dir_.path() + "/fail")
      .put('x');  // rank 1 of generation 0 exits 3

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << "generation 1 never started";
  for (uint32_t r : {0u, 1u}) {
    auto env = Env(1, r);
    EXPECT_EQ(env["CKPT_GENERATION"], "1");
    EXPECT_EQ(env["CKPT_RESTORE_STEP"], "7");
    EXPECT_EQ(env["MASTER_PORT"], "31001");
    EXPECT_EQ(env["RANK"], std::to_string(r));
  }
  EXPECT_TRUE(Dead(Env(0, 0)["PID"])) << "generation 0's rank 0 still runs";
  std::vector<cv1::EventKind> kinds = Events();
  auto at = [&](cv1::EventKind k) {
    return std::find(kinds.begin(), kinds.end(), k) - kinds.begin();
  };
  EXPECT_LT(at(cv1::STEP_DURABLE), at(cv1::FAILURE_DETECTED));
  EXPECT_LT(at(cv1::FAILURE_DETECTED), at(cv1::PLAN_MADE));
  EXPECT_LT(at(cv1::PLAN_MADE), at(cv1::PLAN_ACKED));
  EXPECT_LT(at(cv1::PLAN_ACKED), static_cast<long>(kinds.size()));
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cv1::PLAN_MADE), 1)
      << "only one plan for one failure";
  std::string log_text = ReadFile(log());
  EXPECT_NE(log_text.find("generation 0: rank 1 exited with code 3; reported"),
            std::string::npos)
      << log_text;
  EXPECT_NE(log_text.find("generation 1: start ranks 0,1 at step 7 (restore)"),
            std::string::npos)
      << log_text;
}

// Recovery at the speed of the network: a new view wakes ckptrun's loop
// at once. With a 60 s poll, the first generation's
// trainers and the restarted one's start only when the view arrives;
// before, each waited for the next poll (60 s here, 100 ms by default).
TEST_F(CkptrunTest, NewViewStartsTrainersWithoutWaitingForThePoll) {
  poll_ms_ = "60000";
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("fail1", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1})) << "generation 0 waited for the poll\n"
                                     << ReadFile(log());
  for (auto state : {cv1::STAGED, cv1::DURABLE})
    for (uint32_t r : {0u, 1u}) {
      grpc::Status s = node.ReportShard("train", 7, r, state,
                                        storage::ShardKey("train", 7, r));
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  std::ofstream(dir_.path() + "/fail").put('x');  // rank 1 exits 3
  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << "generation 1 waited for the poll\n"
                                     << ReadFile(log());
  EXPECT_EQ(Env(1, 0)["CKPT_RESTORE_STEP"], "7");
  kill(ckptrun_, SIGTERM);
  EXPECT_EQ(WaitCkptrun(milliseconds(10000)), 143);
}

TEST_F(CkptrunTest,
       CoordinatorRestartLeavesTrainersRunningAndQueuedExitIsReportedLater) {
  // A longer heartbeat timeout: the fake node must outlive the restart.
  coord_ = std::make_unique<testing::CoordinatorProcess>(
      dir_.path() + "/state2", dir_.path() + "/shared", 4000);
  ASSERT_GT(coord_->port(), 0);
  const int port = coord_->port();
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("fail1", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));

  coord_->Kill();
  std::ofstream(dir_.path() + "/fail")
      .put('x');  // rank 1 exits while nobody can hear it
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadFile(log()).find("report queued") != std::string::npos;
      },
      milliseconds(10000)))
      << ReadFile(log());
  EXPECT_FALSE(Dead(Env(0, 0)["PID"]))
      << "rank 0 must keep running while the coordinator is down";

  coord_ = std::make_unique<testing::CoordinatorProcess>(
      dir_.path() + "/state2", dir_.path() + "/shared", 4000, port);
  ASSERT_EQ(coord_->port(), port);
  stub_ = coord_->Stub();
  ASSERT_TRUE(WaitForEnv(1, {0, 1}))
      << "the queued report never led to generation 1";
  EXPECT_TRUE(Dead(Env(0, 0)["PID"]));
  std::string log_text = ReadFile(log());
  EXPECT_NE(log_text.find("coordinator unreachable"), std::string::npos)
      << log_text;
  EXPECT_NE(log_text.find("coordinator reachable again"), std::string::npos)
      << log_text;
  EXPECT_NE(log_text.find("generation 0: rank 1 exited with code 3; reported"),
            std::string::npos)
      << log_text;
}

TEST_F(CkptrunTest, ExitsZeroOnceEveryRankFinishedAndWaitsForNodeToRegister) {
  // ckptrun comes up before the node's daemon: RegisterJob is retried.
  StartCkptrun("exit0", 2);
  // Registered only once ckptrun said it is waiting for a node.
  ASSERT_TRUE(WaitFor(
      [&] { return ReadFile(log()).find("waiting: ") != std::string::npos; },
      milliseconds(30000)))
      << ReadFile(log());
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  EXPECT_EQ(WaitCkptrun(milliseconds(15000)), 0);
  std::vector<cv1::EventKind> kinds = Events();
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cv1::TRAINER_FINISHED), 2);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cv1::FAILURE_DETECTED), 0);
}

// Elastic continuation: the node of rank 0 is lost and no spare exists;
// the job, registered by ckptrun with --min-world-size 1, goes on at world
// size 1 on n1, whose new rank 0 restores saved rank 1 (its own).
TEST_F(CkptrunTest, ShrunkJobStartsRanksWithTheSavedRankToRestore) {
  auto n0 = std::make_unique<testing::FakeNode>(coord_->address(), "n0", "", 1);
  testing::FakeNode n1(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(n0->status().ok());
  ASSERT_TRUE(n1.status().ok());
  StartCkptrun("sleep", 1, "n1",
               {"--world-size", "2", "--min-world-size", "1"});
  ASSERT_TRUE(WaitForEnv(0, {1}));
  EXPECT_EQ(Env(0, 1)["WORLD_SIZE"], "2");
  EXPECT_EQ(Env(0, 1).count("CKPT_RESTORE_RANK"), 0u);
  for (auto state : {cv1::STAGED, cv1::DURABLE})
    for (uint32_t r : {0u, 1u}) {
      grpc::Status s = (r == 0 ? *n0 : n1)
                           .ReportShard("train", 7, r, state,
                                        storage::ShardKey("train", 7, r));
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  n0.reset();  // its heartbeats stop: dead after the timeout, no spare
  ASSERT_TRUE(WaitForEnv(1, {0})) << "the shrunk generation never started";
  auto env = Env(1, 0);
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
  EXPECT_EQ(env["CKPT_RESTORE_STEP"], "7");
  EXPECT_EQ(env["CKPT_RESTORE_RANK"], "1");
  EXPECT_EQ(env["CKPT_RESTORE_WORLD_SIZE"], "2");
  EXPECT_TRUE(Dead(Env(0, 1)["PID"])) << "generation 0's rank 1 still runs";
}

TEST(CkptrunFlagsTest, BadFlagsAreRejectedNamingTheFlag) {
  const std::string ok =
      " --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j "
      "--socket /s";
  struct Case {
    std::string args;
    std::string flag;
  };
  std::vector<Case> cases = {
      {ok + " /bin/true", "--: missing"},
      {ok + " --", "--: no trainer command"},
      {" --node-id n1 --nproc-per-node 1 --job j --socket /s -- /bin/true",
       "--coordinator"},
      {" --coordinator 127.0.0.1:1 --nproc-per-node 1 --job j --socket /s -- "
       "/bin/true",
       "--node-id"},
      {" --coordinator nohost --node-id n1 --nproc-per-node 1 --job j --socket "
       "/s -- /bin/true",
       "--coordinator"},
      {" --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 0 --job j "
       "--socket /s -- /bin/true",
       "--nproc-per-node"},
      {" --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node x --job j "
       "--socket /s -- /bin/true",
       "--nproc-per-node"},
      {ok + " --world-size 0 -- /bin/true", "--world-size"},
      {ok + " --nnodes 0 -- /bin/true", "--nnodes"},
      {ok + " --job bad/name -- /bin/true", "--job"},
      {" --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --socket /s "
       "-- /bin/true",
       "--job"},
      {" --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j -- "
       "/bin/true",
       "--socket"},
      {ok + " --poll-ms 0 -- /bin/true", "--poll-ms"},
      {ok + " --min-world-size 0 -- /bin/true", "--min-world-size"},
      {ok + " --world-size 4 --min-world-size 5 -- /bin/true",
       "--min-world-size"},
      {ok + " --world-size-multiple 0 -- /bin/true", "--world-size-multiple"},
      {ok + " --world-size 4 --min-world-size 3 --world-size-multiple 2 -- "
            "/bin/true",
       "--min-world-size"},
      {ok + " --master-port 65000 -- /bin/true", "--master-port"},
      {ok + " -- /nonexistent/trainer", "CMD"},
  };
  for (const Case& c : cases) {
    testing::CommandResult r = testing::RunCommand(
        "env -u CKPT_JOB -u CKPT_SOCKET " + std::string(CKPTRUN_PATH) + c.args,
        true);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.flag), std::string::npos) << c.args << "\n" << r.out;
  }
}

}  // namespace
}  // namespace ckpt::tools
