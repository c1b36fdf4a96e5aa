// Hang detection with real processes: a trainer stopped with SIGSTOP stays
// alive and says nothing, yet the coordinator names its rank from the
// nodes' beacon reports, ckptrun keeps the stacks of the node's trainers,
// and every rank resumes from one step, checked bit for bit. And a
// ckpt-worker rank blocked inside its step (--fault-hang) while the others
// wait for it in the allreduce: it is named, not the waiters, and the job
// ends with the weights of an undisturbed run.
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

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<cv1::Event> FindEvent(const std::vector<cv1::Event>& events,
                                    cv1::EventKind kind) {
  for (const auto& e : events)
    if (e.kind() == kind) return e;
  return std::nullopt;
}

TEST_F(ClusterTest, StoppedTrainerIsNamedHungItsStacksKeptAndTheJobResumes) {
  ClusterOptions o = Options(4);
  o.step_ms = 100;
  o.last_step = 150;  // nobody finishes before the hang is found
  o.steps_after_restore = 30;
  // A short floor so that the test takes seconds; the first step keeps a
  // generous allowance (a loaded machine starts processes slowly).
  o.coordinator_args = {"--hang-timeout-min-s", "5", "--first-step-timeout-s",
                        "120"};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");
  cluster_->StartNode("b");
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(5));
  pid_t victim = cluster_->TrainerPid(1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const int64_t stopped_ms = MonoMs();
  std::optional<cv1::Event> hang;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        hang = FindEvent(cluster_->Events(), cv1::HANG_DETECTED);
        return hang.has_value();
      },
      seconds(60)))
      << "no HANG_DETECTED";
  ASSERT_EQ(hang->hang().ranks_size(), 1) << hang->detail();
  EXPECT_EQ(hang->hang().ranks(0), 1u) << hang->detail();
  EXPECT_EQ(hang->node_id(), "a");
  EXPECT_FALSE(hang->hang().first_step());
  EXPECT_GE(hang->hang().timeout_s(), 5.0);
  // For the record (not asserted: timing on a shared machine).
  std::printf("hang_detect_s=%.2f hang_timeout_s=%.2f (%s)\n",
              (hang->time_ms() - stopped_ms) / 1000.0, hang->hang().timeout_s(),
              hang->detail().c_str());

  ExpectLaunchersSucceed({"a", "b"});
  for (const auto& e : cluster_->Events())  // shown with a failure
    if (HasFailure() || e.kind() == cv1::HANG_DETECTED)
      std::printf("event %s %s: %s\n", cv1::EventKind_Name(e.kind()).c_str(),
                  e.node_id().c_str(), e.detail().c_str());
  uint64_t step = ExpectAllResumedAtOneStep();
  EXPECT_GE(step, 5u);
  EXPECT_TRUE(FindEvent(cluster_->Events(), cv1::STACKS_CAPTURED).has_value());

  // The stacks of node a's trainers (the stopped one among them) are kept.
  auto stub = cluster_->Stub();
  grpc::ClientContext ctx;
  cv1::GetStacksRequest req;
  req.set_job(o.job);
  cv1::GetStacksResponse resp;
  grpc::Status s = stub->GetStacks(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.reports_size(), 1);
  const cv1::StackReport& r = resp.reports(0);
  EXPECT_EQ(r.node_id(), "a");
  EXPECT_EQ(r.generation(), hang->hang().generation());
  bool found = false;
  for (const cv1::RankStacks& rs : r.ranks()) {
    if (rs.rank() != 1) continue;
    found = true;
    EXPECT_EQ(rs.pid(), static_cast<uint32_t>(victim));
    EXPECT_NE(rs.text().find("== pid " + std::to_string(victim)),
              std::string::npos)
        << rs.text();
    if (rs.tool() != "none") {  // a native tool was there: frames too
      EXPECT_NE(rs.text().find("#0"), std::string::npos) << rs.text();
    }
  }
  EXPECT_TRUE(found) << "no stacks of rank 1";

  // What a script reads: the event's fields and the stacks through ckptctl.
  const std::string ctl = std::string(CKPTCTL_BINARY) +
                          " --coordinator 127.0.0.1:" +
                          std::to_string(cluster_->coordinator_port()) + " ";
  CommandResult events = RunCommand(ctl + "events --job job --json");
  ASSERT_EQ(events.exit_code, 0) << events.out;
  EXPECT_NE(events.out.find(R"("kind":"HANG_DETECTED")"), std::string::npos)
      << events.out;
  EXPECT_NE(events.out.find(R"("rank":1,"ranks":[1],"step":)"),
            std::string::npos)
      << events.out;
  EXPECT_NE(events.out.find(R"("stacks":"ckptctl stacks --job job)"),
            std::string::npos)
      << events.out;
  CommandResult stacks = RunCommand(ctl + "stacks --job job");
  ASSERT_EQ(stacks.exit_code, 0) << stacks.out;
  EXPECT_NE(stacks.out.find("node a rank 1 (pid " + std::to_string(victim)),
            std::string::npos)
      << stacks.out;
}

// The small model ckpt-worker trains in these tests.
std::vector<std::string> WorkerFlags() {
  return SmallWorkerFlags(60, 5, {"--collective-timeout-s", "90"});
}

TEST_F(ClusterTest, WorkerRankBlockedInItsStepIsNamedNotItsWaitersBitExact) {
  constexpr uint32_t kWorld = 4, kHungRank = 2, kHangStep = 23;
  // The undisturbed reference: the same 4 ranks, no fault.
  std::vector<std::string> argv = {CKPT_WORKER_BINARY};
  for (const std::string& f : WorkerFlags()) argv.push_back(f);
  const std::string reference = WorkerReference(argv, kWorld);
  ASSERT_FALSE(reference.empty());

  ClusterOptions o = Options(kWorld);
  o.trainer_command = {CKPT_WORKER_BINARY};
  for (const std::string& f : WorkerFlags()) o.trainer_command.push_back(f);
  o.trainer_command.insert(
      o.trainer_command.end(),
      {"--fault-hang", absl::StrCat(kHangStep, ":", kHungRank)});
  // The worker's collective timeout (90 s) is above the hang timeout, so
  // the waiters are still waiting when the hang is found.
  o.coordinator_args = {"--hang-timeout-min-s", "5", "--first-step-timeout-s",
                        "120"};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  cluster_->StartNode("a");  // ranks 0, 1
  cluster_->StartNode("b");  // ranks 2, 3
  std::optional<cv1::Event> hang;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        hang = FindEvent(cluster_->Events(), cv1::HANG_DETECTED);
        return hang.has_value();
      },
      seconds(120)))
      << "no HANG_DETECTED";
  ASSERT_EQ(hang->hang().ranks_size(), 1) << hang->detail();
  EXPECT_EQ(hang->hang().ranks(0), kHungRank) << hang->detail();
  EXPECT_EQ(hang->hang().step(), kHangStep - 1) << hang->detail();
  EXPECT_EQ(hang->node_id(), "b");
  EXPECT_NE(hang->detail().find("ranks 0-1,3 are ahead and wait for it"),
            std::string::npos)
      << hang->detail();

  ExpectLaunchersSucceed({"a", "b"});
  const std::string logs =
      cluster_->LauncherLog("a") + cluster_->LauncherLog("b");
  EXPECT_NE(logs.find("--fault-hang: blocking forever in step " +
                      std::to_string(kHangStep)),
            std::string::npos)
      << logs;
  // Every rank restarted from one checkpoint and ended with the weights of
  // the undisturbed run.
  std::set<std::string> restored;
  for (size_t at = logs.find("restored step "); at != std::string::npos;
       at = logs.find("restored step ", at + 1)) {
    const size_t digits = at + std::strlen("restored step ");
    const size_t end = logs.find_first_not_of("0123456789", digits);
    if (end != digits) restored.insert(logs.substr(digits, end - digits));
  }
  EXPECT_EQ(restored.size(), 1u) << logs;
  std::map<uint32_t, std::string> digests = WorkerDoneDigests(logs);
  EXPECT_EQ(digests.size(), kWorld) << logs;
  for (const auto& [rank, digest] : digests)
    EXPECT_EQ(digest, reference) << "rank " << rank;
  EXPECT_TRUE(FindEvent(cluster_->Events(), cv1::STACKS_CAPTURED).has_value());
}

}  // namespace
}  // namespace ckpt::testing
