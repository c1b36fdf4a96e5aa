// The shard lifecycle's plain functions (daemon/shard_phase.h,
// daemon/step_state.h): its legal transitions, the slot, catalog and RPC
// states derived from it, and where a restore reads a shard from.
#include "daemon/shard_phase.h"

#include <gtest/gtest.h>

#include "daemon/step_state.h"

namespace ckpt::testing {
namespace {

// The shard lifecycle (shard_phase.h): its transitions and the states
// derived from it.
TEST(ShardPhaseTest, TransitionsAndDerivedStatesAreTheDocumentedOnes) {
  using daemon::ShardPhase;
  EXPECT_TRUE(
      daemon::LegalTransition(ShardPhase::kStaged, ShardPhase::kPersisting));
  EXPECT_TRUE(
      daemon::LegalTransition(ShardPhase::kPersisting, ShardPhase::kStaged));
  EXPECT_TRUE(
      daemon::LegalTransition(ShardPhase::kPersisting, ShardPhase::kDurable));
  EXPECT_TRUE(
      daemon::LegalTransition(ShardPhase::kDurable, ShardPhase::kFailed));
  EXPECT_FALSE(
      daemon::LegalTransition(ShardPhase::kDurable, ShardPhase::kStaged));
  EXPECT_FALSE(
      daemon::LegalTransition(ShardPhase::kFailed, ShardPhase::kStaged));
  EXPECT_FALSE(
      daemon::LegalTransition(ShardPhase::kFailed, ShardPhase::kDurable));
  EXPECT_EQ(daemon::CatalogStateOf(ShardPhase::kPersisting),
            daemon::catv1::ShardRecord::STAGED);
  EXPECT_EQ(daemon::SlotStateOf(ShardPhase::kPersisting),
            shm::SlotState::kPersisting);
  EXPECT_EQ(daemon::RpcStateOf(ShardPhase::kFailed), v1::SHARD_STATE_FAILED);
  daemon::Shard shard;
  EXPECT_TRUE(shard.MoveTo(ShardPhase::kPersisting));
  EXPECT_TRUE(shard.MoveTo(ShardPhase::kDurable));
  EXPECT_EQ(shard.rec.state(), daemon::catv1::ShardRecord::DURABLE);
  EXPECT_FALSE(shard.MoveTo(ShardPhase::kPersisting));
  EXPECT_EQ(shard.phase, ShardPhase::kDurable);
}

// Restore's choice of copy (step_state.h): the slot, else the file the
// client may read itself, else a load; nothing for a shard that is
// neither in memory nor durable.
TEST(RestoreCopyTest, IsTheSlotThenTheFileThenALoad) {
  using daemon::RestoreCopy;
  using daemon::RestoreCopyOf;
  using daemon::ShardPhase;
  daemon::Shard s;
  for (ShardPhase p : {ShardPhase::kStaged, ShardPhase::kPersisting,
                       ShardPhase::kDurable, ShardPhase::kFailed}) {
    s.phase = p;
    s.slot = 1;
    s.local_gone = false;
    EXPECT_EQ(RestoreCopyOf(s, true), RestoreCopy::kSlot) << ShardPhaseName(p);
    s.slot = -1;
    EXPECT_EQ(RestoreCopyOf(s, true), p == ShardPhase::kDurable
                                          ? RestoreCopy::kFileIfReadable
                                          : RestoreCopy::kLost)
        << ShardPhaseName(p);
  }
  s.phase = ShardPhase::kDurable;
  s.slot = -1;
  EXPECT_EQ(RestoreCopyOf(s, false), RestoreCopy::kLoad);
  s.local_gone = true;  // only the object tier's copy is left
  EXPECT_EQ(RestoreCopyOf(s, true), RestoreCopy::kLoad);
}

}  // namespace
}  // namespace ckpt::testing
