// Data-parallel ckpt-worker: two real ckpt-worker processes (RANK 0 and 1,
// WORLD_SIZE 2, MASTER_* on 127.0.0.1) against one real ckptd. The ranks end
// with the same weights, resume bit for bit after a stop or a SIGKILL of one
// rank, fail instead of hanging when a peer dies or never joins, refuse a
// checkpoint of another world size, and compute the same weights with a
// slowed rank, a slow first step and declared evaluations.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shm/beacon.h"
#include "tests/daemon_test.h"
#include "tests/harness.h"
#include "worker/rendezvous_server.h"
#include "worker/rendezvous_store.h"
#include "worker/worker_process.h"

namespace ckpt::worker {
namespace {

using ckpt::testing::DaemonProcess;
using ckpt::testing::TempDir;
using testing::FreePort;
using testing::WorkerProcess;
using testing::WorkerRun;

// One real ckptd per test (tests/daemon_test.h).
class DataParallelTest : public ckpt::testing::DaemonTest {
 protected:
  std::map<std::string, std::string> RankEnv(
      int rank, int world, int port, const std::string& job,
      std::map<std::string, std::string> extra = {}) {
    extra["RANK"] = std::to_string(rank);
    extra["LOCAL_RANK"] = std::to_string(rank);
    extra["WORLD_SIZE"] = std::to_string(world);
    extra["MASTER_ADDR"] = "127.0.0.1";
    extra["MASTER_PORT"] = std::to_string(port);
    if (!job.empty()) {
      extra["CKPT_SOCKET"] = daemon_->socket();
      extra["CKPT_JOB"] = job;
    }
    return extra;
  }

  // Runs ranks 0 and 1 of one job (job "" trains without the daemon).
  // kill_rank1_at: SIGKILL rank 1 once it prints the loss of that step.
  std::vector<WorkerRun> RunTwoRanks(
      std::vector<std::string> flags, const std::string& job,
      std::map<std::string, std::string> env = {},
      std::optional<int> kill_rank1_at = std::nullopt) {
    int port = FreePort();
    // Rank 1 first: it must wait for rank 0's store rather than fail.
    std::optional<std::string> kill_line;
    if (kill_rank1_at)
      kill_line = "step " + std::to_string(*kill_rank1_at) + " loss";
    auto r1 =
        WorkerProcess::Start(flags, RankEnv(1, 2, port, job, env), kill_line);
    auto r0 = WorkerProcess::Start(flags, RankEnv(0, 2, port, job, env));
    WorkerRun b = r1->Wait();
    WorkerRun a = r0->Wait();
    return {a, b};
  }
};

TEST_F(DataParallelTest, AHungRankStaysBehindTheRankWaitingForItsAllreduce) {
  // Rank 1 blocks forever in step 5, before its compute; rank 0 finishes
  // its compute of step 5 and waits for rank 1 in the allreduce until the
  // collective timeout. Their beacons tell them apart: the hung rank is
  // the one behind (what the coordinator's model names).
  std::vector<std::string> flags = {
      "--steps",      "20",  "--ckpt-every",           "1",
      "--fault-hang", "5:1", "--collective-timeout-s", "3"};
  int port = FreePort();
  auto r1 = WorkerProcess::Start(flags, RankEnv(1, 2, port, "hang"));
  auto r0 = WorkerProcess::Start(flags, RankEnv(0, 2, port, "hang"));
  WorkerRun waiter = r0->Wait();
  EXPECT_FALSE(waiter.exited_ok()) << waiter.output;  // its allreduce failed
  auto step_of = [&](int rank) -> int64_t {
    auto view = shm::BeaconView::Open(
        "/" + prefix_ + ".hang.r" + std::to_string(rank), "hang", rank);
    EXPECT_TRUE(view.ok()) << view.status();
    if (!view.ok()) return -1;
    auto snap = (*view)->Read();
    EXPECT_TRUE(snap.has_value()) << "rank " << rank << ": no beacon";
    return snap ? snap->step : -1;
  };
  EXPECT_EQ(step_of(0), 5);  // computed step 5, waited for rank 1
  EXPECT_EQ(step_of(1), 4);  // stuck inside step 5
  r1.reset();                // SIGKILL: it would block forever
}

TEST_F(DataParallelTest,
       SlowRankSlowFirstStepAndDeclaredEvaluationsLeaveTheWeightsUnchanged) {
  // --fault-slow, --slow-first-step-s and --eval-every change the time a
  // run takes, never what it computes: the digest is an undisturbed run's.
  std::vector<WorkerRun> plain = RunTwoRanks({"--steps", "20"}, "");
  ASSERT_TRUE(plain[0].exited_ok()) << plain[0].output;
  std::vector<WorkerRun> r = RunTwoRanks(
      {"--steps", "20", "--ckpt-every", "1", "--fault-slow", "1:3",
       "--slow-first-step-s", "0.2", "--eval-every", "5", "--eval-s", "0.05"},
      "slow");
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(r[rank].exited_ok()) << r[rank].output;
    EXPECT_EQ(r[rank].Digest(), plain[0].Digest()) << r[rank].output;
    EXPECT_NE(r[rank].output.find("\neval step 5 loss "), std::string::npos)
        << r[rank].output;
    EXPECT_NE(r[rank].output.find("\neval step 20 loss "), std::string::npos)
        << r[rank].output;
  }
  // Every evaluation was declared to the hang detector, through the beacon
  // ckptd reads; the slowed rank reported compute times like the others.
  for (int rank = 0; rank < 2; ++rank) {
    auto view = shm::BeaconView::Open(
        "/" + prefix_ + ".slow.r" + std::to_string(rank), "slow", rank);
    ASSERT_TRUE(view.ok()) << view.status();
    auto snap = (*view)->Read();
    ASSERT_TRUE(snap.has_value()) << "rank " << rank << ": no beacon";
    EXPECT_EQ(snap->step, 20);
    EXPECT_EQ(snap->pause_count, 4u) << "rank " << rank;
    EXPECT_EQ(snap->pause_reason, "evaluation after step 20");
    EXPECT_GT(snap->compute_ns, 0u) << "rank " << rank;
  }
}

TEST_F(DataParallelTest, BadFaultAndEvaluationFlagsAreRefusedNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--fault-slow", "1:0.5"}, "--fault-slow"},
      {{"--fault-slow", "x:3"}, "--fault-slow"},
      {{"--fault-slow", "1:nan"}, "--fault-slow"},
      {{"--fault-slow", "1"}, "--fault-slow"},
      {{"--eval-every", "-1"}, "--eval-every"},
      {{"--eval-s", "0"}, "--eval-s"},
      {{"--slow-first-step-s", "-2"}, "--slow-first-step-s"}};
  for (const auto& [flags, name] : cases) {
    std::vector<std::string> argv = {"--steps", "2"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    WorkerRun r = WorkerProcess::Start(argv, {})->Wait();
    EXPECT_EQ(r.exit_code(), 2) << flags[1] << ": " << r.output;
    EXPECT_NE(r.output.find(name), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 1 loss"), std::string::npos) << r.output;
  }
}

// $CKPT_RENDEZVOUS=launcher: the store is served by someone else (ckptrun;
// here the test) and rank 0 serves none: had it tried, the port the
// test's server holds would have failed its rendezvous. A value other
// than "launcher" is refused naming the variable.
TEST_F(DataParallelTest, RanksAreOnlyClientsOfAStoreTheLauncherServes) {
  const int port = FreePort();
  absl::StatusOr<std::unique_ptr<StoreServer>> server =
      StoreServer::Start("127.0.0.1", port);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::map<std::string, std::string> served = {
      {"CKPT_RENDEZVOUS", "launcher"}};
  auto r1 =
      WorkerProcess::Start({"--steps", "10"}, RankEnv(1, 2, port, "", served));
  auto r0 =
      WorkerProcess::Start({"--steps", "10"}, RankEnv(0, 2, port, "", served));
  WorkerRun b = r1->Wait();
  WorkerRun a = r0->Wait();
  ASSERT_TRUE(a.exited_ok()) << a.output;
  ASSERT_TRUE(b.exited_ok()) << b.output;
  EXPECT_EQ(a.Digest(), b.Digest());

  WorkerRun bad =
      WorkerProcess::Start({"--steps", "2"},
                           RankEnv(0, 2, port, "", {{"CKPT_RENDEZVOUS", "x"}}))
          ->Wait();
  EXPECT_FALSE(bad.exited_ok()) << bad.output;
  EXPECT_NE(bad.output.find("$CKPT_RENDEZVOUS = \"x\""), std::string::npos)
      << bad.output;
  EXPECT_EQ(bad.output.find("step 1 loss"), std::string::npos) << bad.output;
}

// A process keeps one channel per store address across generations (no
// new connection on an in-process restart's critical path). The server at
// that address may be another one by the next generation (rank 0's node's
// ckptrun died; a live node's serves the port now): the store of the new
// generation still sets and gets, on the same channel. (With the server
// SIGKILLed instead, a set could go out on the dead connection and fail
// "Socket closed": RendezvousTest.RankZerosNodeLost... caught that, and a
// set now retries UNAVAILABLE.)
TEST_F(DataParallelTest,
       AStoreServedAnewAtTheSameAddressServesTheNextGeneration) {
  const int port = FreePort();
  using std::chrono::seconds;
  auto first = StoreServer::Start("127.0.0.1", port);
  ASSERT_TRUE(first.ok()) << first.status();
  auto g0 = GrpcStore::Connect("127.0.0.1", port, seconds(10), seconds(10));
  ASSERT_TRUE(g0.ok()) << g0.status();
  (*g0)->set("generation/0/0", {'a'});
  EXPECT_EQ((*g0)->get("generation/0/0"), std::vector<char>{'a'});
  first->reset();  // the server goes; the channel stays
  auto second = StoreServer::Start("127.0.0.1", port);
  ASSERT_TRUE(second.ok()) << second.status();
  auto g1 = GrpcStore::Connect("127.0.0.1", port, seconds(10), seconds(10));
  ASSERT_TRUE(g1.ok()) << g1.status();
  try {
    (*g1)->set("generation/1/0", {'b'});
    EXPECT_EQ((*g1)->get("generation/1/0"), std::vector<char>{'b'});
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

// --log-mono: every step line of each rank names the rank and the
// CLOCK_MONOTONIC time the step finished (the clock of the coordinator's
// events, which recovery_bench times recoveries against): within the run,
// in step order.
TEST_F(DataParallelTest, LogMonoStepLinesNameTheRankAndTheMonotonicTime) {
  auto mono_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const long long before = mono_ms();
  std::vector<WorkerRun> r =
      RunTwoRanks({"--steps", "4", "--log-mono", ""}, "");
  const long long after = mono_ms();
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(r[rank].exited_ok()) << r[rank].output;
    long long last = before;
    for (int step = 1; step <= 4; ++step) {
      const std::string head = "step " + std::to_string(step) + " loss ";
      const size_t at = r[rank].output.find(head);
      ASSERT_NE(at, std::string::npos) << r[rank].output;
      const std::string line =
          r[rank].output.substr(at, r[rank].output.find('\n', at) - at);
      const std::string tail = " rank=" + std::to_string(rank) + " mono_ms=";
      const size_t t = line.find(tail);
      ASSERT_NE(t, std::string::npos) << line;
      const long long ms = std::stoll(line.substr(t + tail.size()));
      EXPECT_GE(ms, last) << line;
      EXPECT_LE(ms, after) << line;
      last = ms;
    }
  }
}

TEST_F(DataParallelTest, TwoRanksEndWithTheSameDigestAndLossFalls) {
  std::vector<WorkerRun> r =
      RunTwoRanks({"--steps", "60", "--ckpt-every", "10"}, "dp");
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(r[rank].exited_ok()) << "rank " << rank << ":\n"
                                     << r[rank].output;
    EXPECT_NE(r[rank].output.find("done rank=" + std::to_string(rank)),
              std::string::npos)
        << r[rank].output;
    ASSERT_TRUE(r[rank].LossAt(1).has_value() &&
                r[rank].LossAt(60).has_value());
    EXPECT_LT(*r[rank].LossAt(60), 0.8f * *r[rank].LossAt(1)) << r[rank].output;
  }
  ASSERT_EQ(r[0].Digest().size(), 16u) << r[0].output;
  EXPECT_EQ(r[0].Digest(), r[1].Digest());
  EXPECT_EQ(*r[0].LossAt(60), *r[1].LossAt(60));  // the loss is averaged too

  // Bitwise deterministic for a given world size: a rerun ends the same.
  std::vector<WorkerRun> again = RunTwoRanks({"--steps", "60"}, "");
  ASSERT_TRUE(again[0].exited_ok()) << again[0].output;
  EXPECT_EQ(again[0].Digest(), r[0].Digest());
}

TEST_F(DataParallelTest,
       StoppedTwoRankRunResumesFromTheNamedStepWithTheSameDigest) {
  std::vector<WorkerRun> straight = RunTwoRanks({"--steps", "40"}, "");
  ASSERT_TRUE(straight[0].exited_ok()) << straight[0].output;

  std::vector<WorkerRun> first =
      RunTwoRanks({"--steps", "20", "--ckpt-every", "5"}, "stopped");
  ASSERT_TRUE(first[0].exited_ok() && first[1].exited_ok())
      << first[0].output << first[1].output;
  std::vector<WorkerRun> second =
      RunTwoRanks({"--steps", "40", "--ckpt-every", "5"}, "stopped",
                  {{"CKPT_RESTORE_STEP", "20"}});
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(second[rank].exited_ok()) << second[rank].output;
    EXPECT_NE(second[rank].output.find("restored step 20"), std::string::npos);
    EXPECT_EQ(second[rank].Digest(), straight[0].Digest())
        << second[rank].output;
  }
}

TEST_F(DataParallelTest,
       OneRankKilledFailsItsPeerAndBothResumeFromTheLatestCommonStep) {
  std::vector<std::string> flags = {
      "--steps", "120", "--ckpt-every", "1", "--collective-timeout-s", "10"};
  std::vector<WorkerRun> straight = RunTwoRanks({"--steps", "120"}, "");
  ASSERT_TRUE(straight[0].exited_ok()) << straight[0].output;

  auto began = std::chrono::steady_clock::now();
  // Where ckptrun asks a trainer to say that it lost peers.
  const std::string note = run_.path() + "/peer-lost";
  std::vector<WorkerRun> killed = RunTwoRanks(
      flags, "killed", {{"CKPT_PEER_LOST_FILE", note}}, /*kill_rank1_at=*/30);
  ASSERT_TRUE(killed[1].killed()) << "rank 1 finished before it was killed:\n"
                                  << killed[1].output;
  // Rank 0 notices its dead peer and exits non-zero, well within the timeout.
  EXPECT_EQ(killed[0].exit_code(), 1) << killed[0].output;
  EXPECT_NE(killed[0].output.find("a peer rank died or stalled"),
            std::string::npos)
      << killed[0].output;
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(40));
  // ... and says so, for the coordinator to probe its peer's node.
  std::ifstream said(note);
  EXPECT_TRUE(said.good()) << "rank 0 did not write " << note;

  // Without CKPT_RESTORE_STEP each rank takes the job's latest step, the
  // newest that every rank holds.
  std::vector<WorkerRun> resumed = RunTwoRanks(flags, "killed");
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(resumed[rank].exited_ok()) << resumed[rank].output;
    EXPECT_NE(resumed[rank].output.find("restored step"), std::string::npos);
    EXPECT_EQ(resumed[rank].Digest(), straight[0].Digest())
        << resumed[rank].output;
  }
}

TEST_F(DataParallelTest, CheckpointOfAnotherWorldSizeIsRefusedNamingBoth) {
  WorkerRun single = WorkerProcess::Start({"--steps", "3", "--ckpt-every", "1"},
                                          {{"CKPT_SOCKET", daemon_->socket()},
                                           {"CKPT_JOB", "resized"}})
                         ->Wait();
  ASSERT_TRUE(single.exited_ok()) << single.output;
  std::vector<WorkerRun> r =
      RunTwoRanks({"--steps", "6", "--collective-timeout-s", "5"}, "resized",
                  {{"CKPT_RESTORE_STEP", "3"}});
  EXPECT_EQ(r[0].exit_code(), 1) << r[0].output;
  EXPECT_EQ(r[1].exit_code(), 1) << r[1].output;
  // The first rank to reach the restore refuses naming both sizes; the
  // other may first see that rank leave (its rendezvous or collective
  // fails on the closed peer): which one names them is a race.
  const std::string both =
      "written by a job of world size 1, this run has world size 2";
  EXPECT_TRUE(r[0].output.find(both) != std::string::npos ||
              r[1].output.find(both) != std::string::npos)
      << r[0].output << "\n"
      << r[1].output;
  for (const WorkerRun& w : r)
    EXPECT_EQ(w.output.find("step 4 loss"), std::string::npos) << w.output;
}

TEST_F(DataParallelTest,
       RankWhoseMasterNeverAnswersFailsNamingMasterAddrAndPort) {
  int port = FreePort();
  WorkerRun r =
      WorkerProcess::Start({"--steps", "3", "--connect-timeout-s", "1"},
                           RankEnv(1, 2, port, ""))
          ->Wait();
  EXPECT_EQ(r.exit_code(), 1) << r.output;
  EXPECT_NE(r.output.find("MASTER_ADDR:MASTER_PORT = 127.0.0.1:" +
                          std::to_string(port)),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace ckpt::worker
