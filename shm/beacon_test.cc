#include "shm/beacon.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "shm/arena.h"

namespace ckpt::shm {
namespace {

class BeaconTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "/ckpt_beacon_test." + std::to_string(::getpid()) + "." +
            std::to_string(counter++);
    ArenaOptions o;
    o.name = name_;
    o.job = "job-b";
    o.rank = 2;
    o.world_size = 4;
    o.slot_bytes = 2 << 20;
    o.user_uid = ::geteuid();
    auto arena = Arena::Create(o);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena_ = std::move(*arena);
  }
  void TearDown() override { (void)Arena::Unlink(name_); }
  // The beacon page as a scribbling trainer sees it.
  BeaconPage* RawPage() {
    return reinterpret_cast<BeaconPage*>(arena_->base() + kBeaconOffset);
  }
  std::string name_;
  std::unique_ptr<Arena> arena_;
};

TEST_F(BeaconTest, NewArenaShowsNoBeacon) {
  auto view = BeaconView::Open(name_, "job-b", 2);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_FALSE((*view)->Read().has_value());
  EXPECT_FALSE((*view)->NewestSlotStep().has_value());
}

TEST_F(BeaconTest, ProgressAndPauseReachTheDaemonsView) {
  auto writer = BeaconWriter::Open(name_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto view = BeaconView::Open(name_, "job-b", 2);
  ASSERT_TRUE(view.ok()) << view.status();
  (*writer)->Progress(41, 250'000'000);
  (*writer)->ExpectPause(90'000, "evaluation");
  auto snap = (*view)->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->step, 41);
  EXPECT_EQ(snap->progress_count, 1u);
  EXPECT_EQ(snap->compute_ns, 250'000'000u);
  EXPECT_EQ(snap->pause_count, 1u);
  EXPECT_EQ(snap->pause_ms, 90'000u);
  EXPECT_EQ(snap->pause_reason, "evaluation");
  EXPECT_EQ(snap->pid, static_cast<uint32_t>(::getpid()));
}

TEST_F(BeaconTest, SlotStepsTheDaemonStagedCountAsProgress) {
  arena_->SetSlotState(1, SlotState::kStaged, 17, 0, 4096);
  arena_->SetSlotState(0, SlotState::kDurable, 16, 0, 4096);
  auto view = BeaconView::Open(name_, "job-b", 2);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ((*view)->NewestSlotStep(), std::optional<uint64_t>(17));
}

TEST_F(BeaconTest, GarbageFromTheTrainerIsRejectedNotTrusted) {
  auto view = BeaconView::Open(name_, "job-b", 2);
  ASSERT_TRUE(view.ok());
  BeaconPage* p = RawPage();
  p->progress_count = 3;
  p->step = -5;  // negative step
  EXPECT_FALSE((*view)->Read().has_value());
  p->step = 5;
  p->pause_ms = kMaxPauseMs + 1;  // a pause of more than a day
  EXPECT_FALSE((*view)->Read().has_value());
  p->pause_ms = 0;
  p->seq = 7;  // odd forever: a writer stopped mid-write
  EXPECT_FALSE((*view)->Read().has_value());
  p->seq = 8;
  std::memset(static_cast<void*>(p->pause_reason), 0x07,
              sizeof(p->pause_reason));  // no NUL, unprintable
  auto snap = (*view)->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->pause_reason, std::string(kMaxPauseReasonBytes, '?'));
}

TEST_F(BeaconTest, WriterAfterAKilledWriterMakesTheSeqEvenAgain) {
  RawPage()->seq = 7;
  RawPage()->progress_count = 9;
  auto writer = BeaconWriter::Open(name_);
  ASSERT_TRUE(writer.ok());
  (*writer)->Progress(3, 0);
  auto view = BeaconView::Open(name_, "job-b", 2);
  ASSERT_TRUE(view.ok());
  auto snap = (*view)->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->step, 3);
  EXPECT_EQ(snap->progress_count, 10u);  // goes on from the old count
}

TEST_F(BeaconTest, ViewRefusesAnArenaOfAnotherJobOrRank) {
  EXPECT_EQ(BeaconView::Open(name_, "job-x", 2).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(BeaconView::Open(name_, "job-b", 3).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(
      BeaconView::Open("/ckpt_beacon_test.none", "job-b", 2).status().code(),
      absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::shm
