// A step saved again, and shared memory changed under an upload, with the
// engine in-process (tests/object_tier_engine.h): a step's manifests (local
// and object tier) always describe the shards it holds now, retention never
// deletes a local copy the object tier does not have, and what is uploaded
// is what the checksums describe.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "tests/object_tier_engine.h"

namespace ckpt::testing {
namespace {

using std::chrono::seconds;

// The checksum digest a node manifest records for `rank`, or "" if none.
std::string DigestOf(const storage::v1::NodeManifest& m, uint32_t rank) {
  for (const auto& s : m.shards())
    if (s.rank() == rank) return s.checksums_digest();
  return "";
}

// Rank 0 goes back to an earlier step and saves step 20 again while the
// store is stalled. Step 20's old object manifest named rank 0's old
// shard: it must go, and local retention must keep the new local copy
// until it is uploaded.
TEST_F(ObjectTierEngineTest, ResavedStepDropsItsObjectManifestAndKeepsLocal) {
  Open(EngineOptions::CommitTier::kObject, /*retain_local=*/1,
       /*retain_object=*/0);
  for (uint64_t step : {10, 20})
    for (uint32_t rank : {0, 1})
      ASSERT_TRUE(SaveRank(step, rank, static_cast<int>(step)).ok());
  // Commit tier object: Latest says durable once the engine has recorded
  // step 20's object manifest (not only once the object exists).
  v1::LatestRequest latest;
  latest.set_job("tier");
  Eventually([&] {
    auto l = engine_->Latest(peer_, latest);
    return l.ok() && l->step() == 20 && l->durable();
  });
  auto before = storage::ReadNodeManifest(*object_dir_, Manifest(20));
  ASSERT_TRUE(before.ok()) << before.status();

  gate_->Close();
  ASSERT_TRUE(SaveRank(20, 0, 0x55).ok());
  for (uint64_t step : {30, 40})
    for (uint32_t rank : {0, 1}) {
      absl::Status s = SaveRank(step, rank, static_cast<int>(step));
      ASSERT_TRUE(s.ok()) << step << " " << rank << ": " << s;
    }
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));
  // Steps 30 and 40 are manifested locally, so retention ran for step 20.
  EXPECT_TRUE(local_->Stat(ShardKey(20, 0)).ok())
      << "the only copy of step 20 rank 0 (never uploaded) was deleted";

  const std::string new_shard = Read(*local_, ShardKey(20, 0));
  gate_->Open();
  std::string now;
  EXPECT_TRUE(Within(seconds(30), [&] {
    auto m = storage::ReadNodeManifest(*object_dir_, Manifest(20));
    now = m.ok() ? DigestOf(*m, 0) : "";
    return !now.empty() && now != DigestOf(*before, 0);
  })) << "step 20's object manifest still names rank 0's old shard";
  EXPECT_TRUE(Read(*object_dir_, ShardKey(20, 0)) == new_shard);
}

// A trainer's stray write into a slot whose shard is durable, before the
// upload from that slot: the object must still be the shard the checksums
// describe (the verified local file), not the changed memory.
TEST_F(ObjectTierEngineTest, UploadFromChangedSlotSendsTheVerifiedCopy) {
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  gate_->Close();
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));        // durable on local disk
  Eventually([&] { return gate_->waiting() >= 1; });  // the upload started
  const std::vector<uint64_t> sizes = {64 << 10};
  auto layout = storage::ComputeLayout(sizes);
  ASSERT_TRUE(layout.ok());
  for (uint32_t slot = 0; slot < arena_->num_slots(); ++slot)
    arena_->slot_data(slot)[layout->tensor_offsets[0] + 7] ^= 0x20;
  gate_->Open();
  Eventually([&] { return InObjectTier(Manifest(1)); });
  EXPECT_TRUE(Read(*object_dir_, ShardKey(1)) == Read(*local_, ShardKey(1)))
      << "the object holds the changed memory, not the shard";
}

// The upload of a step's first save is still committing when the step is
// saved again: the object left at the key must be the new shard, whichever
// upload finished last.
TEST_F(ObjectTierEngineTest, OlderUploadOfAKeyNeverLandsAfterTheNewerOne) {
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  gate_->HoldNextCommit(ShardKey(1));
  ASSERT_TRUE(SaveStep(1).ok());
  Eventually([&] { return gate_->waiting() == 1; });  // gen 1 at its Commit
  OneTensorSave again{"tier", 1};
  again.fill = 0x55;
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_, again, &arena_).ok());
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));  // gen 2 durable, queued
  // Give gen 2's upload the chance to overtake (it does without per-key
  // order; with it, it waits for gen 1 and this wait just runs out).
  (void)Within(seconds(3), [&] { return InObjectTier(Manifest(1)); });
  gate_->ReleaseCommit();
  Eventually([&] {
    return InObjectTier(Manifest(1)) && Status().upload_backlog_shards() == 0;
  });
  EXPECT_TRUE(Read(*object_dir_, ShardKey(1)) == Read(*local_, ShardKey(1)))
      << "the first save's upload overwrote the second's";
}

// Rank 0 saves step 2 again while this node's manifest of step 2 is being
// written: the manifest left on disk must describe the new shard.
TEST_F(ObjectTierEngineTest, ManifestWrittenDuringResaveIsNotKeptStale) {
  no_object_tier_ = true;
  Open(EngineOptions::CommitTier::kLocal, /*retain_local=*/1, 0);
  for (uint32_t rank : {0, 1}) ASSERT_TRUE(SaveRank(1, rank, 1).ok());
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));
  local_gate_->Close("MANIFEST");
  for (uint32_t rank : {0, 1}) ASSERT_TRUE(SaveRank(2, rank, 2).ok());
  Eventually([&] { return local_gate_->waiting() == 1; });
  ASSERT_TRUE(SaveRank(2, 0, 0x55).ok());
  local_gate_->Open();
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));
  auto m = storage::ReadNodeManifest(*local_, Manifest(2));
  ASSERT_TRUE(m.ok()) << m.status();
  // Both ranks first saved the same bytes; rank 0's new shard differs.
  EXPECT_NE(DigestOf(*m, 0), DigestOf(*m, 1))
      << "step 2's manifest names rank 0's replaced shard";
}

// The same for the object manifest: rank 0 saves step 1 again while the
// step's object manifest is being written.
TEST_F(ObjectTierEngineTest, ObjectManifestWrittenDuringResaveIsNotKeptStale) {
  Open(EngineOptions::CommitTier::kLocal, 0, 0);
  gate_->Close("MANIFEST");
  for (uint32_t rank : {0, 1}) ASSERT_TRUE(SaveRank(1, rank, 1).ok());
  Eventually([&] { return gate_->waiting() == 1; });
  ASSERT_TRUE(SaveRank(1, 0, 0x55).ok());
  ASSERT_TRUE(engine_->WaitIdle(seconds(20)));
  gate_->Open();
  std::string digests;
  EXPECT_TRUE(Within(
      seconds(30),
      [&] {
        auto m = storage::ReadNodeManifest(*object_dir_, Manifest(1));
        digests = m.ok() ? DigestOf(*m, 0) + " " + DigestOf(*m, 1) : "none";
        return m.ok() && DigestOf(*m, 0) != DigestOf(*m, 1);
      }))
      << "step 1's object manifest names rank 0's replaced shard: " << digests;
}

}  // namespace
}  // namespace ckpt::testing
