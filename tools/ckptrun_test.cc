// Runs the real ckptrun binary against the real ckpt-coordinator binary,
// with /bin/sh trainers that write their environment to a file: the
// environment each rank gets, a failed rank reported and the job restarted
// in the coordinator's next generation, a clean finish, and bad flags.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "storage/shard_format.h"
#include "tests/temp_dir.h"
#include "tools/ckptrun_testing.h"

extern char** environ;

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::milliseconds;

// Writes its environment (and pid) to DIR/env-<generation>-<rank>, then
// behaves as MODE says.
constexpr char kTrainer[] = R"(
d=$1; f="$d/env-$CKPT_GENERATION-$RANK"
{ env; echo "PID=$$"; } > "$f.tmp" && mv "$f.tmp" "$f"
case "$2" in
  exit0) exit 0 ;;
  wrapped) sleep 60 & c=$!; echo "$c" > "$d/child-$RANK.tmp" && mv "$d/child-$RANK.tmp" "$d/child-$RANK"
           wait; exit 0 ;;
  fail1) if [ "$CKPT_GENERATION" = 0 ] && [ "$RANK" = 1 ]; then
           while [ ! -e "$d/fail" ]; do sleep 0.02; done; exit 3
         fi ;;
esac
exec sleep 60
)";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done();
}

class CkptrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coord_ = std::make_unique<testing::CoordinatorProcess>(
        dir_.path() + "/state", dir_.path() + "/shared", 1000);
    ASSERT_GT(coord_->port(), 0);
    stub_ = coord_->Stub();
  }
  void TearDown() override {
    if (ckptrun_ > 0) {
      kill(ckptrun_, SIGKILL);
      waitpid(ckptrun_, nullptr, 0);
    }
    if (!HasFailure()) return;
    std::fprintf(stderr, "ckptrun's log:\n%s\n", ReadFile(log()).c_str());
    grpc::ClientContext ctx;
    cv1::EventsResponse resp;
    if (stub_ && stub_->Events(&ctx, cv1::EventsRequest(), &resp).ok())
      for (const auto& e : resp.events())
        std::fprintf(stderr, "event %llu %s %s %s\n",
                     static_cast<unsigned long long>(e.seq()),
                     cv1::EventKind_Name(e.kind()).c_str(), e.node_id().c_str(),
                     e.detail().c_str());
  }
  std::string log() const { return dir_.path() + "/ckptrun.log"; }
  std::string EnvFile(uint64_t generation, uint32_t rank) const {
    return dir_.path() + "/env-" + std::to_string(generation) + "-" +
           std::to_string(rank);
  }

  // ckptrun for job "train" on node n1, stderr to log().
  void StartCkptrun(const std::string& mode, uint32_t nproc) {
    std::vector<std::string> args = {CKPTRUN_PATH,
                                     "--coordinator",
                                     coord_->address(),
                                     "--node-id",
                                     "n1",
                                     "--nproc-per-node",
                                     std::to_string(nproc),
                                     "--job",
                                     "train",
                                     "--socket",
                                     "/run/ckptd-test.sock",
                                     "--master-port",
                                     "31000",
                                     "--poll-ms",
                                     "50",
                                     "--grace-ms",
                                     "1000",
                                     "--",
                                     "/bin/sh",
                                     "-c",
                                     kTrainer,
                                     "trainer",
                                     dir_.path(),
                                     mode};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log().c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(posix_spawn(&ckptrun_, CKPTRUN_PATH, &actions, nullptr,
                          argv.data(), environ),
              0);
    posix_spawn_file_actions_destroy(&actions);
  }
  // ckptrun's exit code, or -1 if it is still running after `timeout`.
  int WaitCkptrun(milliseconds timeout) {
    int status = 0;
    bool exited =
        WaitFor([&] { return waitpid(ckptrun_, &status, WNOHANG) == ckptrun_; },
                timeout);
    if (!exited) return -1;
    ckptrun_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::map<std::string, std::string> Env(uint64_t generation, uint32_t rank) {
    std::map<std::string, std::string> env;
    std::istringstream in(ReadFile(EnvFile(generation, rank)));
    for (std::string line; std::getline(in, line);) {
      size_t eq = line.find('=');
      if (eq != std::string::npos)
        env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
  }
  bool WaitForEnv(uint64_t generation, std::vector<uint32_t> ranks) {
    return WaitFor(
        [&] {
          return std::all_of(ranks.begin(), ranks.end(), [&](uint32_t r) {
            return access(EnvFile(generation, r).c_str(), F_OK) == 0;
          });
        },
        milliseconds(15000));
  }
  std::vector<cv1::EventKind> Events() {
    grpc::ClientContext ctx;
    cv1::EventsRequest req;
    req.set_job("train");
    cv1::EventsResponse resp;
    EXPECT_TRUE(stub_->Events(&ctx, req, &resp).ok());
    std::vector<cv1::EventKind> kinds;
    for (const auto& e : resp.events()) kinds.push_back(e.kind());
    return kinds;
  }
  // Gone, or a zombie nobody reaped yet (an orphan's reaper may be slow).
  static bool Dead(const std::string& pid) {
    if (kill(std::stoi(pid), 0) != 0 && errno == ESRCH) return true;
    std::string stat = ReadFile("/proc/" + pid + "/stat");
    size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() &&
           stat[paren + 2] == 'Z';
  }

  ckpt::testing::TempDir dir_;
  std::unique_ptr<testing::CoordinatorProcess> coord_;
  std::unique_ptr<cv1::Coordinator::Stub> stub_;
  pid_t ckptrun_ = -1;
};

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

TEST_F(CkptrunTest, TrainersDieWhenCkptrunIsKilled) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("sleep", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  kill(ckptrun_, SIGKILL);
  EXPECT_EQ(WaitCkptrun(milliseconds(5000)), 128 + SIGKILL);
  std::string pid0 = Env(0, 0)["PID"], pid1 = Env(0, 1)["PID"];
  EXPECT_TRUE(
      WaitFor([&] { return Dead(pid0) && Dead(pid1); }, milliseconds(5000)));
}

// Finding 23: `ckptrun -- sh -c ./train.sh` — the real trainer is a child
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
  std::this_thread::sleep_for(milliseconds(300));
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  EXPECT_EQ(WaitCkptrun(milliseconds(15000)), 0);
  std::vector<cv1::EventKind> kinds = Events();
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cv1::TRAINER_FINISHED), 2);
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), cv1::FAILURE_DETECTED), 0);
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
