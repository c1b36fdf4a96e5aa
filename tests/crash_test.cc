// Real processes killed with real signals: a trainer mid-save, the daemon
// mid-persist, a corrupted shard on disk, and a SIGTERM drain.
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "storage/shard_format.h"
#include "tests/await_file.h"
#include "tests/daemon_test.h"
#include "tests/eventually.h"

namespace ckpt::testing {
namespace {

using std::chrono::milliseconds;

class CrashTest : public DaemonTest {
 protected:
  // Slot states of every arena, e.g. {"durable(1)", "writing(2)"}.
  std::vector<std::string> SlotStates() {
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    v1::StatusResponse resp;
    EXPECT_TRUE(daemon_->Stub()->Status(&ctx, req, &resp).ok());
    std::vector<std::string> out;
    for (const auto& a : resp.arenas())
      for (const auto& s : a.slots()) {
        std::string text = absl::AsciiStrToLower(
            absl::StripPrefix(v1::SlotState_Name(s.state()), "SLOT_STATE_"));
        if (s.state() != v1::SLOT_STATE_FREE)
          absl::StrAppend(&text, "(", s.step(), ")");
        if (s.readers()) absl::StrAppend(&text, "+", s.readers(), "r");
        out.push_back(text);
      }
    return out;
  }
  bool AnySlot(const std::string& prefix) {
    for (const auto& s : SlotStates())
      if (s.rfind(prefix, 0) == 0) return true;
    return false;
  }
};

TEST_F(CrashTest, TrainerKilledMidSaveLeavesNoLockedSlotAndNoHalfStep) {
  auto client = Connect("killed");
  ASSERT_NE(client, nullptr);
  HostState good = MakeState(8 << 20, 4, 1);
  ASSERT_TRUE(client->Save(1, good.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());

  // The child saves 1 GiB in a loop; it is killed while a copy is under way.
  // The child saves 1 GiB per step with one copy thread; it is killed while
  // a copy is under way.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    execl(TEST_TRAINER_BINARY, TEST_TRAINER_BINARY, daemon_->socket().c_str(),
          "killed", "1073741824", "2", "100", "1", nullptr);
    _exit(127);
  }
  // Until its copy is under way, or it has ended without one: filling
  // 1 GiB takes an instrumented child on a loaded machine a minute or more.
  int status = 0;
  pid_t ended = 0;
  ASSERT_TRUE(Eventually(
      [&] {
        ended = waitpid(child, &status, WNOHANG);
        return ended != 0 || AnySlot("writing");
      },
      std::chrono::minutes(5)))
      << "the child neither started a save nor ended";
  ASSERT_EQ(ended, 0) << "the child ended (status " << status
                      << ") before it started a save";
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));

  // The daemon notices the exit and frees the slot.
  EXPECT_TRUE(
      Eventually([&] { return !AnySlot("writing"); }, std::chrono::minutes(5)))
      << "the killed child's slot is still being written";

  // No half-written step is visible; whatever was committed is whole.
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok());
  HostState after = MakeState(8 << 20, 4, 3);
  ASSERT_TRUE(client->Save(*latest + 1, after.tensors).ok());
  HostState got = after.EmptyLike();
  ASSERT_TRUE(client->Restore(*latest + 1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(after));
}

TEST_F(CrashTest, DaemonKilledMidPersistFinishesAfterRestart) {
  auto client = Connect("restart");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(512 << 20, 16, 7);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  daemon_->Kill(SIGKILL);  // the persist of 512 MiB is under way
  daemon_->Wait();
  client.reset();
  Restart();
  client = Connect("restart");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->WaitDurable(1).ok());
  HostState got = s.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s));
  // The manifest comes last; once it is there no temp file may be left.
  std::string manifest = root() + "/" + storage::ManifestKey("restart", 1);
  ASSERT_TRUE(AwaitFile(manifest));
  for (auto& e : std::filesystem::recursive_directory_iterator(root()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

// Elastic continuation: a job resized on this node (its trainers now
// register at world size 2) keeps a saved rank of the old size (rank 3 of
// 4) across a ckptd SIGKILL: its arena is re-attached, so the saved rank's
// shard is still served from memory to the new layout's rank 0.
TEST_F(CrashTest, ResizedJobKeepsTheSavedRanksArenaAcrossADaemonKill) {
  auto old = Connect("resized", 3, 4);
  ASSERT_NE(old, nullptr);
  HostState s = MakeState(1 << 20, 4, 9);
  ASSERT_TRUE(old->Save(2, s.tensors).ok());
  ASSERT_TRUE(old->WaitDurable(2).ok());
  old.reset();
  // The resized job's trainer runs under its plan's newer generation.
  ClientOptions resized = OptionsFor(*daemon_, "resized", 0, 2);
  resized.generation = 1;
  auto connected = Client::Connect(resized);
  ASSERT_TRUE(connected.ok()) << connected.status();
  auto now = std::move(*connected);
  HostState t = MakeState(1 << 20, 4, 10);
  ASSERT_TRUE(now->Save(4, t.tensors).ok());  // the job's world size is 2
  now.reset();
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  Restart();
  grpc::ClientContext ctx;
  v1::OpenRestoreRequest req;
  req.set_job("resized");
  req.set_rank(0);
  req.set_step(2);
  req.set_saved_rank(3);
  v1::OpenRestoreResponse resp;
  grpc::Status st = daemon_->Stub()->OpenRestore(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.source(), v1::RESTORE_SOURCE_MEMORY)
      << v1::RestoreSource_Name(resp.source());
  grpc::ClientContext close_ctx;
  v1::CloseRestoreRequest close;
  close.set_job("resized");
  close.set_rank(3);  // the lease is the saved rank's
  close.set_lease(resp.lease());
  v1::CloseRestoreResponse closed;
  st = daemon_->Stub()->CloseRestore(&close_ctx, close, &closed);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // And the library reads it whole.
  now = Connect("resized", 0, 2);
  ASSERT_NE(now, nullptr);
  HostState got = s.EmptyLike();
  ASSERT_TRUE(now->RestoreSavedRank(2, 3, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s));
}

TEST_F(CrashTest, CorruptShardIsDetectedAndThePreviousStepStaysRestorable) {
  auto client = Connect("corrupt");
  ASSERT_NE(client, nullptr);
  HostState s1 = MakeState(8 << 20, 4, 11), s2 = MakeState(8 << 20, 4, 12);
  ASSERT_TRUE(client->Save(1, s1.tensors).ok());
  ASSERT_TRUE(client->Save(2, s2.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(2).ok());
  client.reset();
  // Stop the daemon and drop shared memory, so restores come from disk.
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  std::string shard = root() + "/" + storage::ShardKey("corrupt", 2, 0);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3 * 4096 + 100);  // inside the first tensor's bytes
    char c = 0;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(3 * 4096 + 100);
    f.write(&c, 1);
  }
  Restart();
  client = Connect("corrupt");
  ASSERT_NE(client, nullptr);
  HostState got2 = s2.EmptyLike();
  absl::Status st = client->Restore(2, got2.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(s2.tensors[0].name), absl::string_view::npos)
      << st;
  HostState got1 = s1.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got1.tensors).ok());
  EXPECT_TRUE(got1.Equals(s1));
}

TEST_F(CrashTest, SigtermDrainsPendingPersists) {
  auto client = Connect("drain");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(256 << 20, 8, 21);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  daemon_->Kill(SIGTERM);
  int status = daemon_->Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(
      std::filesystem::exists(root() + "/" + storage::ShardKey("drain", 1, 0)));
  EXPECT_TRUE(
      std::filesystem::exists(root() + "/" + storage::ManifestKey("drain", 1)));
}

}  // namespace
}  // namespace ckpt::testing
