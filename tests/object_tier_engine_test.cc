// The object tier with the engine in-process, over a local directory as
// the second tier behind a gate (a BackendWrapper that holds every write
// until opened, and records deletes) or a FaultInjectionBackend: commit
// tier object, a stalled or failing store, retention order, damaged
// objects. The process-level tests are in object_tier_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "daemon/catalog.h"
#include "daemon/engine.h"
#include "shm/arena.h"
#include "storage/fault_backend.h"
#include "storage/keys.h"
#include "storage/shard_format.h"
#include "tests/engine_save.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

using daemon::Catalog;
using daemon::Engine;
using daemon::EngineOptions;
using daemon::PeerCreds;

// Holds every new object (writers and small objects) until Open(); keeps
// the order of deletes.
class GatedBackend : public storage::BackendWrapper {
 public:
  explicit GatedBackend(Backend* target) : BackendWrapper(target) {}
  using BackendWrapper::NewObjectWriter;
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> l(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  std::vector<std::string> deletes() {
    std::lock_guard<std::mutex> l(mu_);
    return deletes_;
  }
  absl::StatusOr<std::unique_ptr<storage::ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const storage::WriterOptions& o) override {
    Wait();
    return target()->NewObjectWriter(key, size, o);
  }
  absl::Status PutSmallObject(std::string_view key,
                              std::string_view contents) override {
    Wait();
    return target()->PutSmallObject(key, contents);
  }
  absl::Status Delete(std::string_view key) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      deletes_.emplace_back(key);
    }
    return target()->Delete(key);
  }

 private:
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::vector<std::string> deletes_;
};

class ObjectTierEngineTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (gate_) gate_->Open();
    Close();
    UnlinkArenas(prefix_);
  }
  void Open(EngineOptions::CommitTier tier, uint32_t retain_local,
            uint32_t retain_object, bool faulty = false) {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/local";
    local_ = std::move(*storage::NewLocalBackend(lo));
    lo.root = dir_.path() + "/object";
    lo.direct_io = false;
    object_dir_ = std::move(*storage::NewLocalBackend(lo));
    fault_ =
        std::make_unique<storage::FaultInjectionBackend>(object_dir_.get());
    gate_ = std::make_unique<GatedBackend>(
        faulty ? static_cast<storage::Backend*>(fault_.get())
               : object_dir_.get());
    auto cat = Catalog::Open(dir_.path() + "/.catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.retain_steps = retain_local;
    eo.retain_object = retain_object;
    eo.commit_tier = tier;
    eo.upload_threads = 2;
    auto e = Engine::Open(eo, local_.get(), catalog_.get(), gate_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void Close() {
    engine_.reset();
    catalog_.reset();
  }
  // Saves a 64 KiB tensor filled with `step`, writing the slot as a client.
  absl::Status SaveStep(uint64_t step) {
    return SaveOneTensorStep(engine_.get(), peer_, {"tier", step}, &arena_);
  }
  absl::Status WaitDurable(uint64_t step, int timeout_ms = 20000) {
    v1::WaitDurableRequest w;
    w.set_job("tier");
    w.set_step(step);
    w.set_timeout_ms(timeout_ms);
    return engine_->WaitDurable(peer_, w);
  }
  v1::StatusResponse Status() { return engine_->Status(peer_); }
  bool InObjectTier(const std::string& key) {
    return object_dir_->Stat(key).ok();
  }
  std::string Manifest(uint64_t step) {
    return storage::ManifestKey("tier", step);
  }
  std::string ShardKey(uint64_t step) {
    return storage::ShardKey("tier", step, 0);
  }
  // Waits (no time limit of its own: the test's timeout) until pred holds.
  template <typename Pred>
  void Eventually(Pred pred) {
    while (!pred()) usleep(10000);
  }
  std::string Read(storage::Backend& b, const std::string& key) {
    auto size = b.ObjectSize(key);
    EXPECT_TRUE(size.ok()) << size.status();
    std::string out(size.ok() ? *size : 0, '\0');
    EXPECT_TRUE(b.ReadAt(key, 0, out.data(), out.size()).ok());
    return out;
  }
  absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(uint64_t step) {
    v1::OpenRestoreRequest req;
    req.set_job("tier");
    req.set_step(step);
    return engine_->OpenRestore(peer_, req);
  }

  TempDir dir_;
  std::string prefix_ = UniqueShmPrefix();
  PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<storage::Backend> local_, object_dir_;
  std::unique_ptr<storage::FaultInjectionBackend> fault_;
  std::unique_ptr<GatedBackend> gate_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arena_;
};

TEST_F(ObjectTierEngineTest, CommitTierObjectStepIsDurableOnlyAfterItsUpload) {
  Open(EngineOptions::CommitTier::kObject, 0, 0);
  gate_->Close();
  ASSERT_TRUE(SaveStep(1).ok());
  EXPECT_TRUE(
      engine_->WaitIdle(std::chrono::seconds(20)));  // on local disk now
  EXPECT_EQ(WaitDurable(1, 200).code(), absl::StatusCode::kDeadlineExceeded);
  v1::LatestRequest lr;
  lr.set_job("tier");
  auto latest = engine_->Latest(peer_, lr);
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->durable());
  EXPECT_FALSE(InObjectTier(Manifest(1)));
  gate_->Open();
  ASSERT_TRUE(WaitDurable(1).ok());
  // Latest calls the step durable once its object manifest is recorded.
  Eventually([&] { return engine_->Latest(peer_, lr)->durable(); });
  EXPECT_TRUE(InObjectTier(Manifest(1)));
  EXPECT_EQ(Read(*object_dir_, ShardKey(1)), Read(*local_, ShardKey(1)));
}

TEST_F(ObjectTierEngineTest,
       StalledObjectStoreDoesNotBlockSavesAndReportsItsBacklog) {
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  gate_->Close();
  // Two slots, five saves: the uploads that read a slot lose it to later
  // saves and must fall back to the local file.
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(SaveStep(step).ok()) << step;
    ASSERT_TRUE(WaitDurable(step).ok()) << step;  // local is the commit tier
  }
  v1::StatusResponse st = Status();
  EXPECT_EQ(st.commit_tier(), "local");
  EXPECT_EQ(st.upload_backlog_steps(), 5u);
  EXPECT_EQ(st.upload_backlog_shards(), 5u);
  EXPECT_GT(st.upload_backlog_bytes(), 5u * (64 << 10));
  gate_->Open();
  Eventually([&] {
    return InObjectTier(Manifest(5)) && Status().upload_backlog_steps() == 0;
  });
  for (uint64_t step = 1; step <= 5; ++step) {
    Eventually([&] { return InObjectTier(Manifest(step)); });
    EXPECT_EQ(Read(*object_dir_, ShardKey(step)), Read(*local_, ShardKey(step)))
        << step;
  }
  EXPECT_EQ(Status().uploaded_shards(), 5u);
}

TEST_F(ObjectTierEngineTest, FailedUploadIsRetriedAndCountedInStatus) {
  Open(EngineOptions::CommitTier::kObject, 0, 0, /*faulty=*/true);
  fault_->FailNthCommit(1, EIO);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  v1::StatusResponse st = Status();
  EXPECT_GE(st.failed_uploads(), 1u);
  EXPECT_FALSE(st.last_upload_error().empty());
  Eventually([&] { return InObjectTier(Manifest(1)); });
}

TEST_F(ObjectTierEngineTest, RetentionDeletesTheObjectManifestBeforeItsShards) {
  Open(EngineOptions::CommitTier::kObject, /*retain_local=*/1,
       /*retain_object=*/2);
  for (uint64_t step = 1; step <= 4; ++step) {
    ASSERT_TRUE(SaveStep(step).ok());
    ASSERT_TRUE(WaitDurable(step).ok());
    Eventually([&] { return InObjectTier(Manifest(step)); });
  }
  Eventually([&] { return !InObjectTier(ShardKey(2)); });
  for (uint64_t gone : {1, 2}) {
    std::vector<std::string> d = gate_->deletes();
    auto manifest = std::find(d.begin(), d.end(), Manifest(gone));
    auto shard = std::find(d.begin(), d.end(), ShardKey(gone));
    ASSERT_NE(manifest, d.end()) << gone;
    ASSERT_NE(shard, d.end()) << gone;
    EXPECT_LT(manifest - d.begin(), shard - d.begin()) << "step " << gone;
    EXPECT_FALSE(InObjectTier(Manifest(gone)));
  }
  EXPECT_TRUE(InObjectTier(Manifest(3)) && InObjectTier(ShardKey(3)));
  EXPECT_TRUE(InObjectTier(Manifest(4)) && InObjectTier(ShardKey(4)));
  // Local retention keeps one step; step 3 stays restorable from the object
  // tier.
  Eventually([&] { return !local_->Stat(ShardKey(3)).ok(); });
  EXPECT_TRUE(local_->Stat(ShardKey(4)).ok());
  EXPECT_TRUE(OpenRestore(3).ok());
}

TEST_F(ObjectTierEngineTest,
       DamagedObjectIsDataLossNamingTheKeyAndThePreviousStepRestores) {
  Open(EngineOptions::CommitTier::kObject, 0, 0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  ASSERT_TRUE(WaitDurable(2).ok());
  Eventually(
      [&] { return InObjectTier(Manifest(1)) && InObjectTier(Manifest(2)); });
  Close();
  arena_.reset();
  UnlinkArenas(prefix_);
  // The local disk's shards are gone; step 2's object has a flipped byte.
  ASSERT_TRUE(local_->Delete(ShardKey(1)).ok());
  ASSERT_TRUE(local_->Delete(ShardKey(2)).ok());
  std::string object2 = dir_.path() + "/object/" + ShardKey(2);
  {
    std::fstream f(object2, std::ios::in | std::ios::out | std::ios::binary);
    // Inside the tensor, which ends where the footer begins.
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(object2)) -
            storage::kShardAlign - 100);
    f.put('\x7f');
  }
  auto cat = Catalog::Open(dir_.path() + "/.catalog");
  ASSERT_TRUE(cat.ok());
  catalog_ = std::move(*cat);
  EngineOptions eo;
  eo.shm_prefix = prefix_;
  eo.retain_steps = 0;
  eo.commit_tier = EngineOptions::CommitTier::kObject;
  auto e = Engine::Open(eo, local_.get(), catalog_.get(), gate_.get());
  ASSERT_TRUE(e.ok()) << e.status();
  engine_ = std::move(*e);
  auto bad = OpenRestore(2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find(ShardKey(2)), std::string::npos)
      << bad.status();
  auto good = OpenRestore(1);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->source(), v1::RESTORE_SOURCE_OBJECT);
}

}  // namespace
}  // namespace ckpt::testing
