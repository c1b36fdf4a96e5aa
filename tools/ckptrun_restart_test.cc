// ckptrun's side of in-process restart, with real ckptrun and coordinator
// processes and /bin/sh trainers that follow the contract (the keep*
// modes of the fixture's trainer): a capable trainer keeps its process
// across a generation change and takes the new plan; one that is not
// capable, names another pid, or never joins is started anew; a kept
// trainer's word that it lost peers is reported while it runs, and makes
// one plan.
#include "storage/shard_format.h"
#include "tools/ckptrun_fixture.h"

namespace ckpt::tools {
namespace {

class CkptrunRestartTest : public CkptrunTest {
 protected:
  // Step `step` of `ranks` is durable, so a plan restores it.
  void Durable(testing::FakeNode& node, uint64_t step,
               const std::vector<uint32_t>& ranks) {
    for (auto state : {cv1::STAGED, cv1::DURABLE})
      for (uint32_t r : ranks) {
        grpc::Status s = node.ReportShard("train", step, r, state,
                                          storage::ShardKey("train", step, r));
        ASSERT_TRUE(s.ok()) << s.error_message();
      }
  }
  void Touch(const std::string& name) {
    std::ofstream(dir_.path() + "/" + name).put('x');
  }
  bool LogHas(const std::string& text) {
    return ReadFile(log()).find(text) != std::string::npos;
  }
  bool WaitForLog(const std::string& text) {
    return WaitFor([&] { return LogHas(text); }, milliseconds(15000));
  }
  // The trainer of `rank` in `generation` said it is capable.
  bool WaitForCapable(uint64_t generation, uint32_t rank) {
    const std::string path = Env(generation, rank)["CKPT_RESTART_DIR"];
    return !path.empty() &&
           WaitFor(
               [&] { return access((path + "/capable").c_str(), F_OK) == 0; },
               milliseconds(15000));
  }
  size_t Count(cv1::EventKind kind) {
    std::vector<cv1::EventKind> kinds = Events();
    return std::count(kinds.begin(), kinds.end(), kind);
  }
  static size_t Occurrences(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos;
         at = text.find(what, at + 1))
      ++n;
    return n;
  }
};

TEST_F(CkptrunRestartTest, CapableTrainerKeepsItsProcessAndTakesTheNewPlan) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Durable(node, 7, {0, 1});
  Touch("fail");  // rank 1 of generation 0 exits 3

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << "generation 1 never started";
  std::map<std::string, std::string> kept = Env(1, 0);
  EXPECT_EQ(kept["KEPT"], "1") << "rank 0 was started anew";
  EXPECT_EQ(kept["PID"], Env(0, 0)["PID"]);
  EXPECT_FALSE(Dead(kept["PID"]));
  EXPECT_EQ(kept["generation"], "1");
  EXPECT_EQ(kept["rank"], "0");
  EXPECT_EQ(kept["world_size"], "2");
  EXPECT_EQ(kept["local_rank"], "0");
  EXPECT_EQ(kept["local_world_size"], "2");
  EXPECT_EQ(kept["master_addr"], "127.0.0.1");
  EXPECT_EQ(kept["master_port"], "31001");
  EXPECT_EQ(kept["restore_step"], "7");
  // The failed rank's process is gone: started anew, in a new directory.
  std::map<std::string, std::string> fresh = Env(1, 1);
  EXPECT_NE(fresh["PID"], Env(0, 1)["PID"]);
  EXPECT_EQ(fresh["CKPT_RESTORE_STEP"], "7");
  EXPECT_FALSE(fresh["CKPT_RESTART_DIR"].empty());
  EXPECT_NE(fresh["CKPT_RESTART_DIR"], Env(0, 1)["CKPT_RESTART_DIR"]);
  EXPECT_TRUE(
      LogHas("generation 1: rank 0 keeps its process (in-process "
             "restart)"))
      << ReadFile(log());
  EXPECT_TRUE(WaitForLog("generation 1: rank 0 (pid " + kept["PID"] +
                         ") joined (in-process restart)"))
      << ReadFile(log());
  EXPECT_TRUE(LogHas("generation 1: start ranks 1 at step 7 (restore)"))
      << ReadFile(log());
  EXPECT_EQ(Count(cv1::PLAN_MADE), 1u);
}

// A trainer that never says it is capable is stopped and started anew,
// as before; each process gets its own directory with its plan, which
// holds what its environment says.
TEST_F(CkptrunRestartTest, TrainerThatIsNotCapableIsStartedAnewWithItsPlan) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("fail1", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  const std::string dir0 = Env(0, 0)["CKPT_RESTART_DIR"];
  ASSERT_FALSE(dir0.empty()) << "no CKPT_RESTART_DIR";
  EXPECT_EQ(ReadFile(dir0 + "/plan"),
            "generation=0\nrank=0\nworld_size=2\nlocal_rank=0\n"
            "local_world_size=2\nmaster_addr=127.0.0.1\nmaster_port=31000\n");
  struct stat st;
  ASSERT_EQ(stat(dir0.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Durable(node, 7, {0, 1});
  Touch("fail");

  ASSERT_TRUE(WaitForEnv(1, {0, 1}));
  const std::string pid0 = Env(0, 0)["PID"];
  EXPECT_NE(Env(1, 0)["PID"], pid0);
  EXPECT_TRUE(Dead(pid0));
  const std::string dir1 = Env(1, 0)["CKPT_RESTART_DIR"];
  EXPECT_NE(dir1, dir0);
  EXPECT_EQ(ReadFile(dir1 + "/plan"),
            "generation=1\nrank=0\nworld_size=2\nlocal_rank=0\n"
            "local_world_size=2\nmaster_addr=127.0.0.1\nmaster_port=31001\n"
            "restore_step=7\n");
  EXPECT_NE(access(dir0.c_str(), F_OK), 0)
      << "the stopped trainer's directory is left behind";
  EXPECT_FALSE(LogHas("keeps its process")) << ReadFile(log());
}

TEST_F(CkptrunRestartTest, KeptTrainerThatNeverJoinsIsStartedAnewAfterTimeout) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep-nojoin", 2, "n1", {"--restart-timeout", "0.5"});
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Touch("fail");

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << ReadFile(log());
  const std::string pid0 = Env(0, 0)["PID"];
  EXPECT_NE(Env(1, 0)["PID"], pid0);
  EXPECT_EQ(Env(1, 0)["CKPT_GENERATION"], "1");
  EXPECT_TRUE(Dead(pid0));
  const std::string text = ReadFile(log());
  const size_t kept = text.find("generation 1: rank 0 keeps its process");
  const size_t late = text.find(
      "generation 1: rank(s) 0 did not join within 0.5 s (--restart-timeout)");
  EXPECT_NE(kept, std::string::npos) << text;
  EXPECT_NE(late, std::string::npos) << text;
  EXPECT_LT(kept, late) << text;
}

// A kept trainer that exits instead of joining is of the replaced
// generation: its exit is not reported (no second plan) and its rank is
// started anew in the new one.
TEST_F(CkptrunRestartTest, KeptTrainerThatExitsBeforeJoiningIsStartedAnew) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep-exit", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Touch("fail");

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << ReadFile(log());
  EXPECT_NE(Env(1, 0)["PID"], Env(0, 0)["PID"]);
  EXPECT_EQ(Env(1, 0)["CKPT_GENERATION"], "1");
  const std::string text = ReadFile(log());
  EXPECT_NE(text.find("generation 1: rank 0 keeps its process"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("generation 0: rank 0 exited with code 5; not reported "
                      "(generation 1 is current)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("generation 1: start ranks 0 (fresh)"), std::string::npos)
      << text;
  EXPECT_EQ(Count(cv1::PLAN_MADE), 1u);
}

TEST_F(CkptrunRestartTest, CapableNamingAnotherPidIsNotKept) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("keep-badpid", 2);
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  const std::string capable = Env(0, 0)["CKPT_RESTART_DIR"] + "/capable";
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Touch("fail");

  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << ReadFile(log());
  EXPECT_NE(Env(1, 0)["PID"], Env(0, 0)["PID"]);
  EXPECT_EQ(Env(1, 0)["KEPT"], "");
  EXPECT_TRUE(Dead(Env(0, 0)["PID"]));
  EXPECT_TRUE(LogHas("rank 0: " + capable + ": pid: 1 is not the trainer's"))
      << ReadFile(log());
  EXPECT_FALSE(LogHas("rank 0 keeps its process")) << ReadFile(log());
}

// The survivor of a peer's loss does not exit: ckptrun reports its note
// while it runs (process_kept), the coordinator probes the peer's node
// (alive here: the failure is the survivor's own) and plans once, and the
// survivor keeps its process into the new generation.
TEST_F(CkptrunRestartTest, KeptTrainersLostPeersAreReportedOnceWhileItRuns) {
  testing::FakeNode n1(coord_->address(), "n1", "", 1);
  testing::FakeNode n2(coord_->address(), "n2", "", 1);
  ASSERT_TRUE(n1.status().ok() && n2.status().ok());
  StartCkptrun("keep-peerlost", 1, "n1", {"--nnodes", "2"});
  ASSERT_TRUE(WaitForEnv(0, {0})) << "rank 0 is not on n1\n" << ReadFile(log());
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Touch("peerlost");

  ASSERT_TRUE(WaitForEnv(1, {0})) << ReadFile(log());
  EXPECT_EQ(Env(1, 0)["KEPT"], "1");
  EXPECT_EQ(Env(1, 0)["PID"], Env(0, 0)["PID"]);
  ASSERT_TRUE(
      WaitForLog("generation 1: rank 0 (pid " + Env(0, 0)["PID"] + ") joined"))
      << ReadFile(log());
  const std::string text = ReadFile(log());
  EXPECT_NE(text.find("generation 0: rank 0 still running (it lost peer ranks "
                      "1); reported (held: its peers' nodes are probed)"),
            std::string::npos)
      << text;
  EXPECT_EQ(Occurrences(text, "still running"), 1u) << text;
  EXPECT_EQ(Count(cv1::PEER_SUSPECTED), 1u);
  EXPECT_EQ(Count(cv1::PROBE_ANSWERED), 1u);
  EXPECT_EQ(Count(cv1::PLAN_MADE), 1u);
  EXPECT_EQ(Count(cv1::TRAINER_FINISHED), 0u)
      << "a running trainer's report taken for a finish";
}

// The note wakes ckptrun: with a poll period no test outlives, nothing
// but the note's write can bring the report (and so the plan) about.
TEST_F(CkptrunRestartTest, KeptTrainersNoteWakesTheLauncherNotItsPoll) {
  poll_ms_ = "60000";
  testing::FakeNode n1(coord_->address(), "n1", "", 1);
  testing::FakeNode n2(coord_->address(), "n2", "", 1);
  ASSERT_TRUE(n1.status().ok() && n2.status().ok());
  StartCkptrun("keep-peerlost", 1, "n1", {"--nnodes", "2"});
  ASSERT_TRUE(WaitForEnv(0, {0})) << "rank 0 is not on n1\n" << ReadFile(log());
  ASSERT_TRUE(WaitForCapable(0, 0)) << ReadFile(log());
  Touch("peerlost");
  // Before: reported at the next poll, a minute on.
  ASSERT_TRUE(
      WaitForLog("generation 0: rank 0 still running (it lost peer "
                 "ranks 1); reported"))
      << ReadFile(log());
  ASSERT_TRUE(WaitForEnv(1, {0})) << ReadFile(log());
  EXPECT_EQ(Env(1, 0)["KEPT"], "1");
  EXPECT_EQ(Count(cv1::PLAN_MADE), 1u);
}

TEST(CkptrunRestartFlagsTest, BadRestartTimeoutIsRefusedNamingTheFlag) {
  const std::string ok =
      std::string(CKPTRUN_PATH) +
      " --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j "
      "--socket /s --restart-timeout ";
  for (const std::string bad : {"-1", "x", "3601", "nan", "1e3", ""}) {
    testing::CommandResult r =
        testing::RunCommand(ok + "'" + bad + "' -- /bin/true", true);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("--restart-timeout: "), std::string::npos)
        << bad << "\n"
        << r.out;
  }
  testing::CommandResult help =
      testing::RunCommand(std::string(CKPTRUN_PATH) + " --help", true);
  EXPECT_NE(help.out.find("--restart-timeout"), std::string::npos) << help.out;
}

TEST(CkptrunRestartFlagsTest, BadFinishWaitIsRefusedNamingTheFlag) {
  const std::string ok =
      std::string(CKPTRUN_PATH) +
      " --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j "
      "--socket /s --finish-wait-s ";
  for (const std::string bad : {"-1", "x", "86401", "1.5", ""}) {
    testing::CommandResult r =
        testing::RunCommand(ok + "'" + bad + "' -- /bin/true", true);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("--finish-wait-s"), std::string::npos) << bad << "\n"
                                                                << r.out;
  }
}

}  // namespace
}  // namespace ckpt::tools
