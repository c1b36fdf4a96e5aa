// ShardDrops alone, with a real job table, catalog, persister and
// uploader over real local backends: a plan changes nothing; a drop
// forgets the shard at once and deletes, in order, the step's manifest
// before the shard's file (the object manifest before the object), then
// forgets the intents that recorded those deletes; a local delete of a
// file a FILE restore reads waits for its lease; a start queues the
// deletes a previous run left; a save's superseded shards are the rank's
// shards of its step and the newer ones.
#include "daemon/state/shard_drops.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/pipeline/persister.h"
#include "daemon/pipeline/queue_testing.h"
#include "daemon/pipeline/uploader.h"
#include "daemon/state/job_table.h"
#include "storage/keys.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

using testing::EventLog;
using testing::Exists;
using testing::RecordingBackend;

constexpr auto kForever = std::chrono::minutes(10);  // a hung queue, not a race

class ShardDropsTest : public ::testing::Test {
 protected:
  ShardDropsTest()
      : local_(testing::NewLocal(dir_.path() + "/local")),
        object_(testing::NewLocal(dir_.path() + "/object")),
        local_rec_(local_.get(), &local_log_),
        object_rec_(object_.get(), &object_log_) {}
  void SetUp() override {
    auto c = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = std::move(*c);
    writer_ = std::make_unique<CatalogWriter>(catalog_.get());
    persister_ = std::make_unique<Persister>(
        &local_rec_, [](const PersistTask&) {}, catalog_.get(), writer_.get());
    uploader_ = std::make_unique<Uploader>(
        &object_rec_, 1, [](const UploadTask&) { return absl::OkStatus(); },
        catalog_.get(), writer_.get());
    drops_ =
        std::make_unique<ShardDrops>(&table_, catalog_.get(), writer_.get(),
                                     persister_.get(), uploader_.get(), "");
  }
  void TearDown() override {
    uploader_->Stop();
    persister_->Stop();
  }

  // Job "train" (world size 2) with a durable, uploaded shard of rank 0 in
  // each of `steps`, its files and the steps' manifests in both tiers.
  Job& NewJob(const std::vector<uint64_t>& steps)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_.mu()) {
    Job& job = **table_.FindOrAdd("train", ::geteuid(), 2, 2);
    job.recorded = true;
    for (uint64_t n : steps) {
      Shard s;
      s.rec.set_job("train");
      s.rec.set_step(n);
      s.rec.set_rank(0);
      s.rec.set_world_size(2);
      s.Start(ShardPhase::kDurable);
      s.rec.set_path(storage::ShardKey("train", n, 0));
      s.uploaded = true;
      Step& step = job.steps[n];
      step.shards.emplace(0, std::move(s));
      step.manifest = true;
      step.object_manifest = true;
      for (storage::Backend* b : {local_.get(), object_.get()}) {
        EXPECT_TRUE(
            b->PutSmallObject(storage::ShardKey("train", n, 0), "s").ok());
        EXPECT_TRUE(
            b->PutSmallObject(storage::ManifestKey("train", n), "m").ok());
      }
    }
    return job;
  }
  std::vector<std::string> Intents() {
    auto all = catalog_->DeleteIntents();
    EXPECT_TRUE(all.ok()) << all.status();
    std::vector<std::string> out;
    for (const auto& [id, d] : *all)
      out.push_back(absl::StrCat(
          d.tier() == catv1::DeleteIntent::LOCAL ? "local " : "object ",
          absl::StrJoin(d.keys(), ","), d.prefix() ? " prefix" : ""));
    return out;
  }
  void RunQueues() {
    persister_->Start();
    uploader_->Start();
    ASSERT_TRUE(persister_->WaitIdle(kForever));
    ASSERT_TRUE(uploader_->WaitIdle(kForever));
  }

  ::ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<storage::Backend> object_;
  EventLog local_log_;
  EventLog object_log_;
  RecordingBackend local_rec_;
  RecordingBackend object_rec_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<CatalogWriter> writer_;
  JobTable table_;
  std::unique_ptr<Persister> persister_;
  std::unique_ptr<Uploader> uploader_;
  std::unique_ptr<ShardDrops> drops_;
};

const std::string kManifest5 = storage::ManifestKey("train", 5);
const std::string kShard5 = storage::ShardKey("train", 5, 0);

TEST_F(ShardDropsTest, APlanListsTheDeletesInOrderAndChangesNothing) {
  JobTable::Lock lock(&table_);
  Job& job = NewJob({5});
  CatalogEdit edit;
  DropPlan plan = drops_->Plan(job, 5, 0, /*delete_file=*/true, edit);
  EXPECT_EQ(plan.step, 5u);
  ASSERT_EQ(plan.local.size(), 3u);
  EXPECT_EQ(plan.local[0].key, kManifest5);  // the step is no longer whole
  EXPECT_EQ(plan.local[1].key, kShard5);
  EXPECT_EQ(plan.local[2].key, storage::StepPrefix("train", 5));
  EXPECT_TRUE(plan.local[2].prefix);  // its only shard: the step goes
  ASSERT_TRUE(plan.object.has_value());
  EXPECT_EQ(plan.object->keys, (std::vector<std::string>{kManifest5, kShard5}));
  EXPECT_NE(table_.FindShard("train", 5, 0), nullptr);
  EXPECT_EQ(persister_->Size(), 0u);
  EXPECT_TRUE(uploader_->Idle());
  EXPECT_TRUE(Intents().empty());  // only in the edit, not yet written

  // Without delete_file (a re-save of the step): the files stay, the
  // manifests go.
  CatalogEdit keep;
  plan = drops_->Plan(job, 5, 0, /*delete_file=*/false, keep);
  ASSERT_EQ(plan.local.size(), 1u);
  EXPECT_EQ(plan.local[0].key, kManifest5);
  ASSERT_TRUE(plan.object.has_value());
  EXPECT_EQ(plan.object->keys, std::vector<std::string>{kManifest5});
}

TEST_F(ShardDropsTest, ADropDeletesManifestsFirstAndForgetsItsIntents) {
  {
    JobTable::Lock lock(&table_);
    Job& job = NewJob({5});
    drops_->Drop(job, 5, 0, /*delete_file=*/true);
    EXPECT_EQ(table_.FindShard("train", 5, 0), nullptr);  // gone at once
  }
  writer_->Flush();
  EXPECT_EQ(
      Intents(),
      (std::vector<std::string>{
          absl::StrCat("object ", kManifest5, ",", kShard5),
          absl::StrCat("local ", kManifest5), absl::StrCat("local ", kShard5),
          absl::StrCat("local ", storage::StepPrefix("train", 5), " prefix")}));
  RunQueues();
  EXPECT_EQ(
      local_log_.lines(),
      (std::vector<std::string>{
          absl::StrCat("delete ", kManifest5), absl::StrCat("delete ", kShard5),
          absl::StrCat("delete-prefix ", storage::StepPrefix("train", 5))}));
  EXPECT_EQ(object_log_.lines(),
            (std::vector<std::string>{absl::StrCat("delete ", kManifest5),
                                      absl::StrCat("delete ", kShard5)}));
  for (storage::Backend* b : {local_.get(), object_.get()}) {
    EXPECT_FALSE(Exists(*b, kManifest5));
    EXPECT_FALSE(Exists(*b, kShard5));
  }
  EXPECT_TRUE(Intents().empty());
}

TEST_F(ShardDropsTest, ALocalDeleteAFileRestoreReadsWaitsForItsLease) {
  uint64_t lease_id = 0;
  {
    JobTable::Lock lock(&table_);
    Job& job = NewJob({5});
    Lease lease;
    lease.job = "train";
    lease.step = 5;
    lease.file_key = kShard5;
    auto id = table_.leases().Add(lease);
    ASSERT_TRUE(id.ok()) << id.status();
    lease_id = *id;
    drops_->Drop(job, 5, 0, /*delete_file=*/true);
  }
  RunQueues();
  // The manifest and the step's prefix (a prefix the lease's file is
  // under) wait too; the object tier does not.
  EXPECT_EQ(local_log_.lines(),
            std::vector<std::string>{absl::StrCat("delete ", kManifest5)});
  EXPECT_TRUE(Exists(*local_, kShard5));
  EXPECT_FALSE(Exists(*object_, kShard5));
  {
    JobTable::Lock lock(&table_);
    ASSERT_TRUE(table_.leases().Remove(lease_id).has_value());
    drops_->ReleaseDeferred();
  }
  ASSERT_TRUE(persister_->WaitIdle(kForever));
  EXPECT_EQ(
      local_log_.lines(),
      (std::vector<std::string>{
          absl::StrCat("delete ", kManifest5), absl::StrCat("delete ", kShard5),
          absl::StrCat("delete-prefix ", storage::StepPrefix("train", 5))}));
  EXPECT_FALSE(Exists(*local_, kShard5));
  EXPECT_TRUE(Intents().empty());
}

TEST_F(ShardDropsTest, AStartQueuesTheDeletesAPreviousRunLeft) {
  ASSERT_TRUE(local_->PutSmallObject("train/old", "x").ok());
  ASSERT_TRUE(object_->PutSmallObject("train/m", "x").ok());
  ASSERT_TRUE(object_->PutSmallObject("train/s", "x").ok());
  catv1::DeleteIntent local;
  local.set_tier(catv1::DeleteIntent::LOCAL);
  local.add_keys("train/old");
  catv1::DeleteIntent object;
  object.set_tier(catv1::DeleteIntent::OBJECT);
  object.add_keys("train/m");
  object.add_keys("train/s");
  ASSERT_TRUE(catalog_->PutDeleteIntent(local).ok());
  ASSERT_TRUE(catalog_->PutDeleteIntent(object).ok());
  ASSERT_TRUE(catalog_->PutDeleteIntent(catv1::DeleteIntent()).ok());  // empty
  ASSERT_TRUE(drops_->Recover().ok());
  EXPECT_EQ(Intents().size(), 2u);  // the empty one is forgotten at once
  RunQueues();
  EXPECT_EQ(local_log_.lines(), std::vector<std::string>{"delete train/old"});
  EXPECT_EQ(object_log_.lines(),
            (std::vector<std::string>{"delete train/m", "delete train/s"}));
  EXPECT_FALSE(Exists(*local_, "train/old"));
  EXPECT_FALSE(Exists(*object_, "train/s"));
  EXPECT_TRUE(Intents().empty());
}

TEST_F(ShardDropsTest, ASaveSupersedesItsStepAndTheNewerOnes) {
  JobTable::Lock lock(&table_);
  Job& job = NewJob({4, 5, 6, 7});
  EXPECT_EQ(ShardDrops::Newer(job, 5, 0), (std::vector<uint64_t>{6, 7}));
  EXPECT_TRUE(ShardDrops::Newer(job, 5, 1).empty());  // rank 1 has none
  CatalogEdit edit;
  std::vector<DropPlan> drops = drops_->PlanSuperseded(job, 6, 0, edit);
  ASSERT_EQ(drops.size(), 2u);
  EXPECT_EQ(drops[0].step, 6u);  // re-written: its file stays
  EXPECT_EQ(drops[0].local.size(), 1u);
  EXPECT_EQ(drops[1].step, 7u);  // rewound past: its file goes
  EXPECT_EQ(drops[1].local.size(), 3u);
  const std::vector<std::string> basis = ShardDrops::Basis(job, drops);
  EXPECT_EQ(basis.size(), 2u);
  ASSERT_TRUE(table_.EraseShard(job, 7, 0));
  EXPECT_EQ(ShardDrops::Basis(job, drops)[0], basis[0]);
  EXPECT_EQ(ShardDrops::Basis(job, drops)[1], "gone");
}

}  // namespace
}  // namespace ckpt::daemon
