// The object tier with the engine in-process, over a local directory as
// the second tier behind a gate (a BackendWrapper that holds every write
// until opened, and records deletes) or a FaultInjectionBackend: commit
// tier object, a stalled or failing store, retention order, damaged
// objects. The process-level tests are in object_tier_test.cc.
#include "tests/object_tier_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "storage/shard_format.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

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

// The fallback ladder's rung below the local file: a local copy
// that a restore found bad is dropped and the next restore of the same step
// reads the object tier's copy, which the load verifies, rather than losing
// the step. Both ways a client meets the local copy: reading the file
// itself (FILE), and a slot the daemon loaded from it.
class ObjectTierFallbackTest : public ObjectTierEngineTest,
                               public ::testing::WithParamInterface<bool> {
 protected:
  // A restart without shared memory: only the stored copies are left.
  void ReopenWithoutSharedMemory() {
    Close();
    arena_.reset();
    UnlinkArenas(prefix_);
    Open(EngineOptions::CommitTier::kLocal, 0, 0);
  }
};

TEST_P(ObjectTierFallbackTest, BadLocalCopyFallsBackToTheObjectCopyOfTheStep) {
  const bool file_read = GetParam();
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  Eventually([&] {
    return InObjectTier(Manifest(1)) && Status().upload_backlog_steps() == 0;
  });
  ReopenWithoutSharedMemory();
  FlipFirstTensorByteOfFile(dir_.path() + "/local/" + ShardKey(1));
  auto first = OpenRestore(1, file_read);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->source(),
            file_read ? v1::RESTORE_SOURCE_FILE : v1::RESTORE_SOURCE_DISK);
  ASSERT_TRUE(
      CloseRestore(1, first->lease(), "tensor 'w': checksum mismatch").ok());

  auto next = OpenRestore(1, file_read);
  ASSERT_TRUE(next.ok()) << "the step was lost with its local copy: "
                         << next.status();
  EXPECT_EQ(next->source(), v1::RESTORE_SOURCE_OBJECT);
  EXPECT_TRUE(CloseRestore(1, next->lease()).ok());
  std::vector<daemon::FallbackReport> f = Fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].step, 1u);
  EXPECT_EQ(f[0].copy, "file");
  EXPECT_EQ(f[0].next_copy, "object");
  EXPECT_NE(f[0].reason.find("checksum mismatch"), std::string::npos)
      << f[0].reason;
  EXPECT_TRUE(f[0].verified_bad);
  v1::LatestRequest lr;
  lr.set_job("tier");
  auto latest = engine_->Latest(peer_, lr);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_TRUE(latest->found());
  EXPECT_EQ(latest->step(), 1u);
  // The bad local file goes; the object copy stays.
  EXPECT_TRUE(Within(std::chrono::seconds(20),
                     [&] { return !local_->Stat(ShardKey(1)).ok(); }));
  EXPECT_TRUE(InObjectTier(ShardKey(1)));
  // A restart keeps the decision: the step is read from the object tier.
  ReopenWithoutSharedMemory();
  auto after = OpenRestore(1, file_read);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->source(), v1::RESTORE_SOURCE_OBJECT);
}

// A client's claim is checked before anything is dropped: a node with
// faulty memory or a faulty device finds good copies bad, and must not
// delete them. The local copy that verifies stays, restores keep reading
// it (across a restart too), and the report says it verified.
TEST_P(ObjectTierFallbackTest, ClaimedBadLocalCopyThatVerifiesIsKept) {
  const bool file_read = GetParam();
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  Eventually([&] {
    return InObjectTier(Manifest(1)) && Status().upload_backlog_steps() == 0;
  });
  ReopenWithoutSharedMemory();
  auto first = OpenRestore(1, file_read);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(
      CloseRestore(1, first->lease(), "tensor 'w': checksum mismatch").ok());
  const v1::RestoreSource local =
      file_read ? v1::RESTORE_SOURCE_FILE : v1::RESTORE_SOURCE_DISK;
  auto next = OpenRestore(1, file_read);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->source(), file_read ? local : v1::RESTORE_SOURCE_MEMORY)
      << "the good local copy was dropped on the client's word";
  EXPECT_TRUE(CloseRestore(1, next->lease()).ok());
  std::vector<daemon::FallbackReport> f = Fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].verified_bad);
  EXPECT_EQ(f[0].copy, file_read ? "file" : "memory");
  EXPECT_TRUE(local_->Stat(ShardKey(1)).ok());
  ReopenWithoutSharedMemory();
  auto after = OpenRestore(1, file_read);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->source(), local);
}

// Without another copy a claim used to fail the shard, and Latest walked
// back: a step that verifies stays the latest and restorable.
TEST_P(ObjectTierFallbackTest, ClaimedBadOnlyCopyThatVerifiesKeepsTheStep) {
  const bool file_read = GetParam();
  no_object_tier_ = true;
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  ASSERT_TRUE(WaitDurable(2).ok());
  ReopenWithoutSharedMemory();
  auto first = OpenRestore(2, file_read);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(
      CloseRestore(2, first->lease(), "tensor 'w': checksum mismatch").ok());
  v1::LatestRequest lr;
  lr.set_job("tier");
  auto latest = engine_->Latest(peer_, lr);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step(), 2u) << "a step that verifies was dropped";
  auto next = OpenRestore(2, file_read);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(CloseRestore(2, next->lease()).ok());
  std::vector<daemon::FallbackReport> f = Fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].verified_bad);
  EXPECT_TRUE(local_->Stat(ShardKey(2)).ok());
}

// A claim with no lease (a client of a daemon that handed out none) names
// only a step: the current file is checked, and kept when it verifies.
TEST_F(ObjectTierEngineTest, LeaselessClaimAboutAGoodFileKeepsIt) {
  no_object_tier_ = true;
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  Close();
  arena_.reset();
  UnlinkArenas(prefix_);
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  ASSERT_TRUE(CloseRestore(1, 0, "tensor 'w': checksum mismatch").ok());
  auto next = OpenRestore(1, true);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->source(), v1::RESTORE_SOURCE_FILE);
  EXPECT_TRUE(CloseRestore(1, next->lease()).ok());
  std::vector<daemon::FallbackReport> f = Fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(f[0].verified_bad);
}

INSTANTIATE_TEST_SUITE_P(ReadBy, ObjectTierFallbackTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "TheClient" : "TheDaemon";
                         });

}  // namespace
}  // namespace ckpt::testing
