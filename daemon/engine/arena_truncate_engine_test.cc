// The engine in-process (this test is the daemon) while the job's uid
// truncates its arena in the middle of a persist or an upload from it: a
// CPU access to the truncated mapping raises SIGBUS, which must neither
// kill the process nor let zeros pass for the shard. A persist fails for
// good with an error naming the arena; an upload sends the durable local
// file instead. Storage calls are held (GatedBackend) so that the
// truncation lands exactly between the commit and the read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "tests/engine_save.h"
#include "tests/gated_backend.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using daemon::Engine;
using daemon::PeerCreds;

class ArenaTruncateEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(daemon::EngineOptions::CommitTier::kLocal); }
  void Open(daemon::EngineOptions::CommitTier tier) {
    engine_.reset();
    catalog_.reset();
    storage::LocalBackendOptions lo, oo;
    lo.root = dir_.path() + "/root";
    oo.root = dir_.path() + "/object";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    auto object = storage::NewLocalBackend(oo);
    ASSERT_TRUE(object.ok()) << object.status();
    object_ = std::move(*object);
    local_gate_ = std::make_unique<GatedBackend>(local_.get());
    object_gate_ = std::make_unique<GatedBackend>(object_.get());
    auto cat = daemon::Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.commit_tier = tier;
    auto e =
        Engine::Open(eo, local_gate_.get(), catalog_.get(), object_gate_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    engine_.reset();
    catalog_.reset();
    arena_.reset();
    UnlinkArenas(prefix_);
  }
  absl::Status WaitDurable(uint64_t step) {
    v1::WaitDurableRequest w;
    w.set_job("job");
    w.set_step(step);
    w.set_timeout_ms(60000);
    return engine_->WaitDurable(peer_, w);
  }
  // Waits until a storage call is held at `gate`.
  static void AwaitHeld(GatedBackend& gate) {
    while (gate.waiting() == 0) std::this_thread::yield();
  }
  // What the job's uid may do: truncate its segment to nothing.
  void TruncateArena() {
    const std::string path = "/dev/shm" + arena_->name();
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
    ASSERT_EQ(ftruncate(fd, 0), 0) << strerror(errno);
    close(fd);
  }
  // The bytes of the one .shard file under `root`.
  static std::string ShardFile(const std::string& root) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root))
      if (e.path().extension() == ".shard") {
        std::ifstream f(e.path(), std::ios::binary);
        return {std::istreambuf_iterator<char>(f), {}};
      }
    return {};
  }

  TempDir dir_;
  const std::string prefix_ = UniqueShmPrefix();
  const PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<storage::Backend> local_, object_;
  std::unique_ptr<GatedBackend> local_gate_, object_gate_;
  std::unique_ptr<daemon::Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arena_;  // the job's mapping
};

TEST_F(ArenaTruncateEngineTest, PersistFromATruncatedArenaFailsNamingIt) {
  local_gate_->Close();  // the persist waits before its write
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 1, .fill = 0x5a},
                                &arena_)
                  .ok());
  AwaitHeld(*local_gate_);
  TruncateArena();
  local_gate_->Open();
  absl::Status s = WaitDurable(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(arena_->name()), std::string::npos)
      << "the error does not name arena " << arena_->name() << ": " << s;
  EXPECT_TRUE(engine_->WaitIdle(std::chrono::seconds(30)));
  EXPECT_EQ(ShardFile(dir_.path() + "/root"), "") << "a shard was persisted";
}

TEST_F(ArenaTruncateEngineTest, UploadFromATruncatedArenaSendsTheLocalFile) {
  // Durable once uploaded: WaitDurable waits for the upload.
  Open(daemon::EngineOptions::CommitTier::kObject);
  object_gate_->Close();  // the upload waits before it reads the slot
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 1, .fill = 0x5a},
                                &arena_)
                  .ok());
  AwaitHeld(*object_gate_);
  TruncateArena();
  object_gate_->Open();
  absl::Status durable = WaitDurable(1);
  ASSERT_TRUE(durable.ok()) << durable;
  const std::string local = ShardFile(dir_.path() + "/root");
  ASSERT_FALSE(local.empty());
  const std::string object = ShardFile(dir_.path() + "/object");
  EXPECT_TRUE(object == local)
      << "the object tier does not hold the local file's bytes ("
      << object.size() << " bytes, the file " << local.size() << ")";
}

}  // namespace
}  // namespace ckpt::testing
