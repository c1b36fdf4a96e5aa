// ckptrun --warm: trainer processes started ahead, with real ckptrun and
// coordinator processes and the fixture's /bin/sh trainer (a warm one
// writes DIR/warm-<pid> and waits for its plan): a killed rank goes to the
// warm process started before the kill, a warm process that dies is
// replaced, one that dies at once every time is not forked forever, and
// warm processes end with the job.
#include <dirent.h>

#include "storage/shard_format.h"
#include "tools/ckptrun_fixture.h"

namespace ckpt::tools {
namespace {

class CkptrunWarmTest : public CkptrunTest {
 protected:
  void Durable(testing::FakeNode& node, uint64_t step,
               const std::vector<uint32_t>& ranks) {
    for (auto state : {cv1::STAGED, cv1::DURABLE})
      for (uint32_t r : ranks) {
        grpc::Status s = node.ReportShard("train", step, r, state,
                                          storage::ShardKey("train", step, r));
        ASSERT_TRUE(s.ok()) << s.error_message();
      }
  }
  bool LogHas(const std::string& text) {
    return ReadFile(log()).find(text) != std::string::npos;
  }
  bool WaitForLog(const std::string& text) {
    return WaitFor([&] { return LogHas(text); }, milliseconds(20000));
  }
  // The pids of every warm process started so far (DIR/warm-<pid>).
  std::set<std::string> WarmPids() {
    std::set<std::string> pids;
    DIR* d = opendir(dir_.path().c_str());
    if (d == nullptr) return pids;
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind("warm-", 0) == 0 &&
          name.find_first_not_of("0123456789", 5) == std::string::npos)
        pids.insert(name.substr(5));
    }
    closedir(d);
    return pids;
  }
  // A warm process other than those of `known`, once ckptrun says it is
  // ready; "" if none comes.
  std::string WaitForReadyWarm(const std::set<std::string>& known = {}) {
    std::string found;
    WaitFor(
        [&] {
          for (const std::string& pid : WarmPids())
            if (known.count(pid) == 0 &&
                LogHas("warm process (pid " + pid + ") ready"))
              found = pid;
          return !found.empty();
        },
        milliseconds(20000));
    return found;
  }
  static size_t Occurrences(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos;
         at = text.find(what, at + 1))
      ++n;
    return n;
  }
  size_t Count(cv1::EventKind kind) {
    std::vector<cv1::EventKind> kinds = Events();
    return std::count(kinds.begin(), kinds.end(), kind);
  }
};

TEST_F(CkptrunWarmTest, KilledRankIsPlacedInTheWarmProcessStartedBefore) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep", 2, "n1", {"--warm", "1"});
  ASSERT_TRUE(WaitForEnv(0, {0, 1})) << ReadFile(log());
  const std::string warm = WaitForReadyWarm();
  ASSERT_FALSE(warm.empty()) << ReadFile(log());
  EXPECT_FALSE(Dead(warm));
  // The survivor must be capable, or it is stopped and started anew.
  const std::string survivor_dir = Env(0, 0)["CKPT_RESTART_DIR"];
  ASSERT_TRUE(WaitFor(
      [&] { return access((survivor_dir + "/capable").c_str(), F_OK) == 0; },
      milliseconds(20000)));
  Durable(node, 7, {0, 1});
  const std::string victim = Env(0, 1)["PID"];
  ASSERT_EQ(kill(std::stoi(victim), SIGKILL), 0);

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << ReadFile(log());
  std::map<std::string, std::string> placed = Env(1, 1);
  EXPECT_EQ(placed["PID"], warm) << "rank 1 was not placed in the warm process";
  EXPECT_EQ(placed["CKPT_WARM"], "1");
  EXPECT_EQ(placed["CKPT_RESTORE_STEP"], "7");
  EXPECT_EQ(Env(1, 0)["PID"], Env(0, 0)["PID"]) << "the survivor was restarted";
  EXPECT_TRUE(LogHas("generation 1: rank 1 placed in a warm process (pid " +
                     warm + ") at step 7 (restore)"))
      << ReadFile(log());
  EXPECT_FALSE(LogHas("generation 1: start ranks")) << ReadFile(log());
  // Another is started to take its place.
  EXPECT_FALSE(WaitForReadyWarm({warm}).empty()) << ReadFile(log());
  EXPECT_EQ(Count(cv1::PLAN_MADE), 1u);
}

TEST_F(CkptrunWarmTest, WarmProcessThatDiesIsReplacedAndAllEndWithTheJob) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep", 1, "n1", {"--warm", "1"});
  const std::string first = WaitForReadyWarm();
  ASSERT_FALSE(first.empty()) << ReadFile(log());
  ASSERT_EQ(kill(std::stoi(first), SIGKILL), 0);

  const std::string second = WaitForReadyWarm({first});
  ASSERT_FALSE(second.empty()) << ReadFile(log());
  EXPECT_TRUE(LogHas("warm process (pid " + first +
                     ") exited with signal 9; another is started in 200 ms"))
      << ReadFile(log());
  ASSERT_TRUE(WaitForEnv(0, {0}));
  const std::string trainer = Env(0, 0)["PID"];
  EXPECT_FALSE(Dead(trainer));
  EXPECT_EQ(Count(cv1::PLAN_MADE), 0u) << "a warm process's death planned";

  ASSERT_EQ(kill(ckptrun_, SIGTERM), 0);
  EXPECT_EQ(WaitCkptrun(milliseconds(20000)), 128 + SIGTERM);
  EXPECT_TRUE(Dead(second)) << "a warm process outlived the job";
  EXPECT_TRUE(Dead(trainer));
}

TEST_F(CkptrunWarmTest, WarmCommandThatDiesAtOnceIsNotForkedForever) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("warm-crash", 1, "n1", {"--warm", "1"});
  ASSERT_TRUE(
      WaitForLog("5 died in a row before one was ready: no more warm "
                 "processes are started (--warm)"))
      << ReadFile(log());
  const std::string text = ReadFile(log());
  EXPECT_EQ(Occurrences(text, "warm process started"), 5u) << text;
  EXPECT_EQ(Occurrences(text, "exited with code 9; another is started in"), 4u)
      << text;
  // The job's own trainer is untouched.
  ASSERT_TRUE(WaitForEnv(0, {0}));
  EXPECT_FALSE(Dead(Env(0, 0)["PID"]));
}

TEST(CkptrunWarmFlagsTest, BadWarmIsRefusedNamingTheFlag) {
  const std::string ok =
      std::string(CKPTRUN_PATH) +
      " --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j "
      "--socket /s ";
  for (const std::string bad : {"-1", "x", "65", "1.5", "", "100000000000"}) {
    testing::CommandResult r =
        testing::RunCommand(ok + "--warm '" + bad + "' -- /bin/true", true);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("--warm: "), std::string::npos) << bad << "\n"
                                                         << r.out;
  }
  testing::CommandResult off = testing::RunCommand(
      ok + "--warm 1 --restart-timeout 0 -- /bin/true", true);
  EXPECT_EQ(off.exit_code, 2) << off.out;
  EXPECT_NE(off.out.find("--warm: "), std::string::npos) << off.out;
  testing::CommandResult help =
      testing::RunCommand(std::string(CKPTRUN_PATH) + " --help", true);
  EXPECT_NE(help.out.find("--warm"), std::string::npos) << help.out;
}

}  // namespace
}  // namespace ckpt::tools
