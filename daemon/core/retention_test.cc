// Retention's decisions (daemon/core/retention.h), plain functions over a step
// table: which steps go from the local tier alone, from the object tier
// (and so from both), and which ones may never go.
#include "daemon/core/retention.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace ckpt::testing {
namespace {

using daemon::ShardPhase;
using daemon::Step;

// Steps `from`..`to` of one rank (rank 0 of world 1), each durable and
// with its local and object manifests written.
std::map<uint64_t, Step> Steps(uint64_t from, uint64_t to) {
  std::map<uint64_t, Step> steps;
  for (uint64_t n = from; n <= to; ++n) {
    Step& s = steps[n];
    daemon::Shard& shard = s.shards[0];
    shard.Start(ShardPhase::kDurable);
    shard.uploaded = true;
    s.manifest = true;
    s.object_manifest = true;
  }
  return steps;
}

void Fail(std::map<uint64_t, Step>& steps, uint64_t n) {
  daemon::Shard& shard = steps[n].shards[0];
  shard.MoveTo(ShardPhase::kFailed);
  steps[n].manifest = steps[n].object_manifest = false;
  shard.uploaded = false;
}

TEST(RetentionTest, TheObjectTierKeepsItsNewestStepsAndNoBrokenOnes) {
  using V = std::vector<uint64_t>;
  std::map<uint64_t, Step> steps = Steps(1, 6);
  // retain_object 2, retain_steps 3: steps 1-4 go from both tiers.
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, false, nullptr),
            (V{1, 2, 3, 4}));
  // 0 keeps everything.
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 0, 3, false, nullptr), V{});
  // Steps not yet in the object tier do not count towards its retain.
  steps[6].object_manifest = false;
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, false, nullptr),
            (V{1, 2, 3}));
  // A step that can never be whole counts in neither tier's retain: it goes
  // beyond the newest retain_steps, once, and after the older ones.
  steps = Steps(1, 8);
  Fail(steps, 5);
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 4, 3, false, nullptr),
            (V{1, 2, 3, 5}));
  Fail(steps, 7);  // among the newest 3: kept for now
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 4, 3, false, nullptr),
            (V{1, 2, 5}));
}

TEST(RetentionTest, InClusterModeNothingGoesFromTheCoordinatorsKeepFromOn) {
  using V = std::vector<uint64_t>;
  std::map<uint64_t, Step> steps = Steps(1, 6);
  daemon::Hosting hosting;
  hosting.ranks = {0};
  // keep_from unknown: nothing goes.
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, true, &hosting), V{});
  EXPECT_TRUE(daemon::ShardsToDrop(steps, 2, true, &hosting).empty());
  // Another node lags: the job may still restore step 2.
  hosting.keep_from = 2;
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, true, &hosting), V{1});
  // ... and that step is never dropped as broken either.
  Fail(steps, 2);
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, true, &hosting), V{1});
  hosting.keep_from = 5;
  EXPECT_EQ(daemon::ObjectTierStepsToDrop(steps, 2, 3, true, &hosting),
            (V{1, 2, 3, 4}));
}

TEST(RetentionTest, TheLocalTierDropsOnlyCopiesTheObjectTierHolds) {
  std::map<uint64_t, Step> steps = Steps(1, 5);
  steps[2].shards[0].uploaded = false;  // still uploading: its file stays
  steps[2].object_manifest = false;
  Fail(steps, 3);  // never whole: goes from both tiers
  const daemon::LocalTierDrops drops =
      daemon::LocalTierDropsOf(steps, 2, 1, false, nullptr);
  EXPECT_EQ(drops.local_only, (std::vector<uint64_t>{1}));
  EXPECT_EQ(drops.whole, (std::vector<uint64_t>{3}));
  // Without tiers every shard below the cutoff goes, and the broken one.
  const auto shards = daemon::ShardsToDrop(steps, 2, false, nullptr);
  const std::vector<std::pair<uint64_t, uint32_t>> want = {
      {1, 0}, {2, 0}, {3, 0}};
  EXPECT_EQ(shards, want);
}

}  // namespace
}  // namespace ckpt::testing
