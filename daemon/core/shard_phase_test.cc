// The shard lifecycle's plain functions (daemon/core/shard_phase.h,
// daemon/core/step_state.h): its legal transitions, the slot, catalog and RPC
// states derived from it, where a restore reads a shard from, and what a
// persist's outcome does to it.
#include "daemon/core/shard_phase.h"

#include <gtest/gtest.h>

#include "daemon/core/step_state.h"

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

// A persist's outcome (PersistVerdictOf, step_state.h): durable, given up
// on DataLoss only, otherwise retried with a doubling delay and the slot
// released once the attempts are used up; a save that went meanwhile
// takes its file with it unless the key is another save's.
TEST(PersistVerdictTest, RetriesAllButDataLossAndDropsOrphanedFiles) {
  using daemon::PersistVerdict;
  using std::chrono::milliseconds;
  const daemon::PersistRetryPolicy p{3, milliseconds(200), milliseconds(1000)};
  auto of = [&](absl::StatusCode code, uint32_t attempts) {
    return daemon::PersistVerdictOf(true, true, code, attempts, p);
  };
  EXPECT_EQ(of(absl::StatusCode::kOk, 0).kind, PersistVerdict::kDurable);
  EXPECT_EQ(of(absl::StatusCode::kOk, 2).kind, PersistVerdict::kDurable);
  EXPECT_EQ(of(absl::StatusCode::kDataLoss, 1).kind, PersistVerdict::kAbandon);
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kInternal,
        absl::StatusCode::kNotFound})
    EXPECT_EQ(of(code, 1).kind, PersistVerdict::kRetry) << code;
  const absl::StatusCode io = absl::StatusCode::kUnavailable;
  EXPECT_EQ(of(io, 1).retry_after, milliseconds(200));
  EXPECT_EQ(of(io, 2).retry_after, milliseconds(400));
  EXPECT_EQ(of(io, 3).retry_after, milliseconds(800));
  EXPECT_EQ(of(io, 4).retry_after, milliseconds(1000));   // the ceiling
  EXPECT_EQ(of(io, 60).retry_after, milliseconds(1000));  // no overflow
  EXPECT_FALSE(of(io, 2).release_slot);
  EXPECT_TRUE(of(io, 3).release_slot);
  EXPECT_TRUE(of(io, 4).release_slot);
  // A ceiling below the first delay: the first delay, every time.
  const daemon::PersistRetryPolicy low{3, milliseconds(500), milliseconds(10)};
  EXPECT_EQ(daemon::PersistVerdictOf(true, true, io, 5, low).retry_after,
            milliseconds(500));
  // The save went while it was written.
  auto gone = [&](bool key_in_use, absl::StatusCode code) {
    return daemon::PersistVerdictOf(false, key_in_use, code, 0, p);
  };
  EXPECT_EQ(gone(false, absl::StatusCode::kOk).kind, PersistVerdict::kOrphan);
  EXPECT_TRUE(gone(false, absl::StatusCode::kOk).delete_file);
  EXPECT_FALSE(gone(true, absl::StatusCode::kOk).delete_file)
      << "a newer save of the same step owns the file at that key";
  EXPECT_FALSE(gone(false, io).delete_file) << "nothing was written";
  EXPECT_EQ(gone(false, io).kind, PersistVerdict::kOrphan);
}

}  // namespace
}  // namespace ckpt::testing
