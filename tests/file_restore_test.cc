// Restores of a step that is only on disk: the client reads the shard file
// itself (no arena is created) when the daemon answers FILE, and verifies
// checksums; the daemon answers with a slot load instead when the caller
// cannot read the file (another uid, a mode that forbids it).
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "storage/shard_format.h"
#include "tests/daemon_test.h"

namespace ckpt::testing {
namespace {

class FileRestoreTest : public DaemonTest {
 protected:
  // Saves steps 1 and 2 of `job` (72 MiB: several 32 MiB read chunks),
  // then restarts the daemon without its shared memory, so both steps are
  // only on disk.
  void SaveAndDropMemory(const std::string& job) {
    auto client = Connect(job);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Save(1, s1_.tensors).ok());
    ASSERT_TRUE(client->Save(2, s2_.tensors).ok());
    ASSERT_TRUE(client->WaitDurable(2).ok());
    client.reset();
    daemon_->Kill(SIGTERM);
    daemon_->Wait();
    UnlinkArenas(prefix_);
    Restart();
  }
  int Arenas() {
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    v1::StatusResponse resp;
    EXPECT_TRUE(daemon_->Stub()->Status(&ctx, req, &resp).ok());
    return resp.arenas_size();
  }
  // The index entry of `tensor` in step `step` of `job`, rank 0.
  v1::TensorMeta Meta(const std::string& job, uint64_t step,
                      const std::string& tensor) {
    grpc::ClientContext ctx;
    v1::OpenRestoreRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_allow_file_read(true);
    v1::OpenRestoreResponse resp;
    EXPECT_TRUE(daemon_->Stub()->OpenRestore(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.source(), v1::RESTORE_SOURCE_FILE);
    for (const auto& m : resp.tensors())
      if (m.name() == tensor) return m;
    ADD_FAILURE() << tensor << " not in the index";
    return {};
  }
  std::string Shard(const std::string& job, uint64_t step) {
    return root() + "/" + storage::ShardKey(job, step, 0);
  }

  HostState s1_ = MakeState(72 << 20, 7, 51), s2_ = MakeState(72 << 20, 7, 52);
};

TEST_F(FileRestoreTest, DiskOnlyStepIsReadFromTheFileBitExactWithoutAnArena) {
  SaveAndDropMemory("file");
  auto client = Connect("file");
  ASSERT_NE(client, nullptr);
  HostState got = s2_.EmptyLike();
  absl::Status st = client->Restore(2, got.tensors);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(got.Equals(s2_));
  // The bounce buffers are reused: an older step, then a subset.
  HostState got1 = s1_.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got1.tensors).ok());
  EXPECT_TRUE(got1.Equals(s1_));
  HostState sub = s2_.EmptyLike();
  ASSERT_TRUE(
      client->Restore(2, std::span<const Tensor>(sub.tensors).subspan(3, 2))
          .ok());
  EXPECT_EQ(sub.buffers[4], s2_.buffers[4]);
  EXPECT_EQ(sub.buffers[3], s2_.buffers[3]);
  EXPECT_NE(sub.buffers[2], s2_.buffers[2]);  // not asked for: still zero
  EXPECT_EQ(Arenas(), 0);                     // no slot load happened
}

// Tensors at 4 KiB-aligned addresses are read straight into (O_DIRECT, no
// bounce copy) and then hashed in place.
TEST_F(FileRestoreTest, AlignedHostTensorsAreReadStraightInAndVerified) {
  SaveAndDropMemory("aligned");
  auto client = Connect("aligned");
  ASSERT_NE(client, nullptr);
  std::vector<std::unique_ptr<char, decltype(&std::free)>> mem;
  std::vector<Tensor> tensors = s2_.tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t n = s2_.buffers[i].size();
    mem.emplace_back(
        static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)),
        &std::free);
    std::memset(mem.back().get(), 0, n);
    tensors[i].data = mem.back().get();
  }
  absl::Status st = client->Restore(2, tensors);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < tensors.size(); ++i)
    EXPECT_EQ(0, std::memcmp(mem[i].get(), s2_.buffers[i].data(),
                             s2_.buffers[i].size()))
        << tensors[i].name;
  // A flipped byte in the middle of a tensor is caught on this path too.
  const std::string name = s2_.tensors[3].name;
  v1::TensorMeta m = Meta("aligned", 2, name);
  {
    std::fstream f(Shard("aligned", 2),
                   std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t at = m.offset() + m.bytes() / 2;
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x04;
    f.seekp(at);
    f.write(&c, 1);
  }
  st = client->Restore(2, tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(name), absl::string_view::npos) << st;
  EXPECT_EQ(Arenas(), 0);
}

TEST_F(FileRestoreTest, FlippedByteIsDataLossNamingTheTensor) {
  SaveAndDropMemory("flip");
  const std::string name = s2_.tensors[5].name;
  v1::TensorMeta m = Meta("flip", 2, name);
  ASSERT_GT(m.bytes(), 0u);
  {
    std::fstream f(Shard("flip", 2),
                   std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t at = m.offset() + m.bytes() - 1;  // the tensor's last piece
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(at);
    f.write(&c, 1);
  }
  auto client = Connect("flip");
  ASSERT_NE(client, nullptr);
  HostState got = s2_.EmptyLike();
  absl::Status st = client->Restore(2, got.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find(name), absl::string_view::npos) << st;
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());  // step 1 is intact
  EXPECT_EQ(Arenas(), 0);
}

TEST_F(FileRestoreTest, TruncatedFileIsDataLoss) {
  SaveAndDropMemory("trunc");
  std::filesystem::resize_file(Shard("trunc", 2), 40 << 20);
  auto client = Connect("trunc");
  ASSERT_NE(client, nullptr);
  HostState got = s2_.EmptyLike();
  absl::Status st = client->Restore(2, got.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s1_));
}

// Drops the file-permission overrides from the calling thread's effective
// capabilities (capset on one thread affects only that thread), so that a
// root test sees EACCES like an ordinary user would.
bool DropDacOverrideOnThisThread() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  data[0].effective &=
      ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
  return syscall(SYS_capset, &hdr, data) == 0;
}

TEST_F(FileRestoreTest, UnreadableFileFallsBackToTheDaemonsLoad) {
  SaveAndDropMemory("perm");
  ASSERT_EQ(chmod(Shard("perm", 2).c_str(), 0), 0);
  auto client = Connect("perm");
  ASSERT_NE(client, nullptr);
  HostState got = s2_.EmptyLike();
  absl::Status st;
  bool dropped = false;
  std::thread t([&] {
    dropped = DropDacOverrideOnThisThread();
    if (dropped) st = client->Restore(2, got.tensors);
  });
  t.join();
  ASSERT_TRUE(dropped);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(got.Equals(s2_));
  EXPECT_EQ(Arenas(), 1);  // the daemon loaded the shard into a slot
}

// Runs test_trainer as uid/gid 65534 (nobody) on job: saves steps
// [first, last] of its state (MakeState(bytes, 8, 2)), then restores step
// `restore` unless it is negative. Returns its exit status, -1 if it did
// not exit.
int RunTrainerAsNobody(const std::string& socket, const std::string& job,
                       uint64_t bytes, int first, int last, int restore) {
  std::string uid = "TEST_TRAINER_UID=65534";
  std::string step = "TEST_TRAINER_RESTORE=" + std::to_string(restore);
  char* envp[] = {uid.data(), restore >= 0 ? step.data() : nullptr, nullptr};
  const std::string b = std::to_string(bytes), f = std::to_string(first),
                    l = std::to_string(last);
  pid_t child = fork();
  if (child == 0) {
    execle(TEST_TRAINER_BINARY, TEST_TRAINER_BINARY, socket.c_str(),
           job.c_str(), b.c_str(), f.c_str(), l.c_str(), nullptr, envp);
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

// The daemon decides where a restore reads from: it answers
// FILE only when the caller can read the shard file. Here it cannot (the
// root is 0700 and owned by the daemon's uid), so it must load the shard
// into a slot; the client makes one OpenRestore and never probes the file.
TEST_F(FileRestoreTest, AnotherUidThatCannotReadTheFileGetsASlotLoad) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to run the trainer as another uid";
  const uint64_t bytes = 24 << 20;
  ASSERT_EQ(RunTrainerAsNobody(daemon_->socket(), "nobody", bytes, 1, 1, -1),
            0);
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  Restart();
  ASSERT_EQ(chmod(root().c_str(), 0700), 0);
  EXPECT_EQ(RunTrainerAsNobody(daemon_->socket(), "nobody", bytes, 1, 0, 1), 0)
      << "exit 4: the restore failed (see its stderr), 5: wrong bytes";
}

}  // namespace
}  // namespace ckpt::testing
