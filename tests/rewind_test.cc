// A save of a step below the rank's newest deletes the newer steps (a new
// timeline). Through a real ckptd: a trainer that starts over without
// restoring is refused and every checkpoint stays; one that restored an
// older step, or asks for the rewind, gets it, and the rewind is counted
// and recorded as a ROLLBACK event (ckptctl status).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "storage/keys.h"
#include "tests/daemon_test.h"
#include "tests/metrics_scrape.h"

namespace ckpt::testing {
namespace {

constexpr uint64_t kBytes = 1 << 20;

struct TrainerRun {
  int exit_code = -1;  // -1: it did not exit
  std::string stderr_text;
};

// Runs test_trainer (a process of its own) saving [first, last]; with
// resume >= 0 it restores that step first. Only system calls between fork
// and exec: this process runs gRPC threads.
TrainerRun RunTrainer(const std::string& socket, const std::string& job,
                      int first, int last, int resume = -1) {
  TrainerRun run;
  int fds[2];
  if (pipe(fds) != 0) return run;
  const std::string bytes = std::to_string(kBytes), f = std::to_string(first),
                    l = std::to_string(last);
  std::string env = "TEST_TRAINER_RESUME=" + std::to_string(resume);
  char* envp[] = {resume >= 0 ? env.data() : nullptr, nullptr};
  pid_t child = fork();
  if (child == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execle(TEST_TRAINER_BINARY, TEST_TRAINER_BINARY, socket.c_str(),
           job.c_str(), bytes.c_str(), f.c_str(), l.c_str(), nullptr, envp);
    _exit(127);
  }
  close(fds[1]);
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
    run.stderr_text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status))
    run.exit_code = WEXITSTATUS(status);
  return run;
}

class RewindTest : public DaemonTest {
 protected:
  void SetUp() override {
    port_ = FreeLoopbackPort();
    auto d = DaemonProcess::Start(
        root(), run_.path(), prefix_,
        {"--metrics-listen", "127.0.0.1:" + std::to_string(port_)});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  double Rollbacks() {
    std::optional<std::string> text =
        HttpGet("http://127.0.0.1:" + std::to_string(port_) + "/metrics");
    EXPECT_TRUE(text.has_value()) << "GET /metrics failed";
    return SampleValue(text.value_or(""), "ckptd_rollbacks_total", {})
        .value_or(-1);
  }
  // The events ckptd reports in its Status answer.
  std::vector<v1::DaemonEvent> Events() {
    grpc::ClientContext ctx;
    v1::StatusResponse resp;
    grpc::Status s = daemon_->Stub()->Status(&ctx, v1::StatusRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.events().begin(), resp.events().end()};
  }
  static std::vector<uint64_t> Dropped(const v1::DaemonEvent& e) {
    return {e.dropped_steps().begin(), e.dropped_steps().end()};
  }
  // The shard files of the job on disk.
  std::set<std::string> ShardFiles(const std::string& job) {
    std::set<std::string> out;
    const std::string dir = root() + "/" + storage::JobPrefix(job);
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec))
      if (e.path().extension() == ".shard") out.insert(e.path().string());
    return out;
  }
  // Saves steps 10 and 20 (durable) through one client; returns their
  // states.
  std::pair<HostState, HostState> SaveTenAndTwenty(Client& client) {
    HostState s10 = MakeState(kBytes, 8, 10), s20 = MakeState(kBytes, 8, 20);
    EXPECT_TRUE(client.Save(10, s10.tensors).ok());
    EXPECT_TRUE(client.Save(20, s20.tensors).ok());
    EXPECT_TRUE(client.WaitDurable(10).ok());
    EXPECT_TRUE(client.WaitDurable(20).ok());
    return {std::move(s10), std::move(s20)};
  }

  int port_ = 0;
};

TEST_F(RewindTest, TrainerStartingOverWithoutRestoreIsRefusedAndKeepsAll) {
  auto first = Connect("over");
  ASSERT_NE(first, nullptr);
  auto [s10, s20] = SaveTenAndTwenty(*first);
  const std::set<std::string> files = ShardFiles("over");
  ASSERT_EQ(files.size(), 2u);

  // Another process starts at step 0 without restoring anything.
  TrainerRun run = RunTrainer(daemon_->socket(), "over", 0, 0);
  EXPECT_EQ(run.exit_code, 3) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("newest step(s) 10, 20"), std::string::npos)
      << run.stderr_text;

  // A new client of this process (it restored nothing either).
  auto fresh = Connect("over");
  ASSERT_NE(fresh, nullptr);
  HostState s0 = MakeState(kBytes, 8, 0);
  absl::Status s = fresh->Save(0, s0.tensors);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("step: 0 is below this rank's newest step(s) "
                             "10, 20 of job over"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("rewind"), std::string::npos) << s;

  // Nothing changed: the newest step, both steps bit-exact, their files.
  auto latest = fresh->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 20);
  EXPECT_EQ(ShardFiles("over"), files);
  HostState got10 = s10.EmptyLike(), got20 = s20.EmptyLike();
  ASSERT_TRUE(fresh->Restore(10, got10.tensors).ok());
  ASSERT_TRUE(fresh->Restore(20, got20.tensors).ok());
  EXPECT_TRUE(got10.Equals(s10));
  EXPECT_TRUE(got20.Equals(s20));
  EXPECT_EQ(Rollbacks(), 0);
  EXPECT_TRUE(Events().empty());
}

TEST_F(RewindTest, ResavingTheNewestStepStaysAllowed) {
  auto first = Connect("resave");
  ASSERT_NE(first, nullptr);
  auto [s10, s20] = SaveTenAndTwenty(*first);
  EXPECT_EQ(RunTrainer(daemon_->socket(), "resave", 20, 21).exit_code, 0);
  EXPECT_EQ(Rollbacks(), 0);
}

TEST_F(RewindTest, ProcessThatRestoredAnOlderStepContinuesFromIt) {
  auto client = Connect("resume");
  ASSERT_NE(client, nullptr);
  auto [s10, s20] = SaveTenAndTwenty(*client);
  // A restore of step 20 does not make a save of 15 a rewind to it.
  HostState got = s20.EmptyLike();
  ASSERT_TRUE(client->Restore(20, got.tensors).ok());
  HostState s15 = MakeState(kBytes, 8, 15);
  EXPECT_EQ(client->Save(15, s15.tensors).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Rollbacks(), 0);

  // The normal recovery path: restore 10, go on at 11.
  ASSERT_TRUE(client->Restore(10, got.tensors).ok());
  HostState s11 = MakeState(kBytes, 8, 11);
  absl::Status s = client->Save(11, s11.tensors);
  ASSERT_TRUE(s.ok()) << s;
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 11);
  EXPECT_EQ(client->Restore(20, got.tensors).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Rollbacks(), 1);
  std::vector<v1::DaemonEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), "ROLLBACK");
  EXPECT_EQ(events[0].job(), "resume");
  EXPECT_EQ(events[0].rank(), 0u);
  EXPECT_EQ(events[0].from_step(), 20u);
  EXPECT_EQ(events[0].to_step(), 11u);
  EXPECT_EQ(Dropped(events[0]), std::vector<uint64_t>{20});
}

TEST_F(RewindTest, RestartedProcessThatRestoresFirstMayGoOn) {
  auto client = Connect("restart");
  ASSERT_NE(client, nullptr);
  auto [s10, s20] = SaveTenAndTwenty(*client);
  TrainerRun run = RunTrainer(daemon_->socket(), "restart", 11, 12,
                              /*resume=*/10);
  EXPECT_EQ(run.exit_code, 0) << run.stderr_text;
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 12);
  EXPECT_EQ(Rollbacks(), 1);
}

// A job that died before any step was complete on every rank has nothing
// to restore: its restarted trainers start over, and a fast rank's newer
// shards, of steps no restore can ever return, must not stop them.
TEST_F(RewindTest, NewerStepsNoRestoreCanReturnDoNotStopAStartOver) {
  auto fast = Connect("early", /*rank=*/0, /*world=*/2);
  ASSERT_NE(fast, nullptr);
  HostState s1 = MakeState(kBytes, 8, 1), s2 = MakeState(kBytes, 8, 2);
  ASSERT_TRUE(fast->Save(1, s1.tensors).ok());
  ASSERT_TRUE(fast->Save(2, s2.tensors).ok());
  auto again = Connect("early", /*rank=*/0, /*world=*/2);
  ASSERT_NE(again, nullptr);
  absl::Status s = again->Save(1, s1.tensors);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Rollbacks(), 1);
}

TEST_F(RewindTest, ExplicitRewindDropsTheNewerSteps) {
  auto first = Connect("rewind");
  ASSERT_NE(first, nullptr);
  auto [s10, s20] = SaveTenAndTwenty(*first);
  auto fresh = Connect("rewind");
  ASSERT_NE(fresh, nullptr);
  HostState s5 = MakeState(kBytes, 8, 5);
  SaveOptions rewind;
  rewind.rewind = true;
  absl::Status s = fresh->Save(5, s5.tensors, rewind);
  ASSERT_TRUE(s.ok()) << s;
  auto latest = fresh->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 5);
  HostState got = s10.EmptyLike();
  EXPECT_EQ(fresh->Restore(10, got.tensors).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(fresh->Restore(20, got.tensors).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Rollbacks(), 1);
  std::vector<v1::DaemonEvent> events = Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), "ROLLBACK");
  EXPECT_EQ(events[0].job(), "rewind");
  EXPECT_EQ(events[0].from_step(), 20u);
  EXPECT_EQ(events[0].to_step(), 5u);
  EXPECT_EQ(Dropped(events[0]), (std::vector<uint64_t>{10, 20}));
  EXPECT_GT(events[0].unix_time_s(), 0);
  // SaveAsync takes the options too.
  HostState s3 = MakeState(kBytes, 8, 3);
  auto handle = fresh->SaveAsync(3, s3.tensors, rewind);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_TRUE(handle->Wait().ok());
  EXPECT_EQ(Rollbacks(), 2);
}

}  // namespace
}  // namespace ckpt::testing
