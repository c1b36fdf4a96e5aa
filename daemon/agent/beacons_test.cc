// BeaconMonitor on real arenas, with the poll's clock in the test's hands.
#include "daemon/agent/beacons.h"

#include <unistd.h>

#include <atomic>

#include "gtest/gtest.h"
#include "shm/arena.h"

namespace ckpt::daemon {
namespace {

using std::chrono::milliseconds;
using Clock = BeaconMonitor::Clock;

class BeaconMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    prefix_ = "ckpt-beacons-test-" + std::to_string(::getpid()) + "-" +
              std::to_string(counter++);
    BeaconMonitorOptions o;
    o.shm_prefix = prefix_;
    o.window = 100;
    monitor_ = std::make_unique<BeaconMonitor>(o);
  }
  void TearDown() override {
    for (const auto& n : names_) (void)shm::Arena::Unlink(n);
  }
  std::unique_ptr<shm::Arena> CreateArena(const std::string& job,
                                          uint32_t rank) {
    shm::ArenaOptions o;
    o.name = "/" + prefix_ + "." + job + ".r" + std::to_string(rank);
    o.job = job;
    o.rank = rank;
    o.world_size = 8;
    o.slot_bytes = 2 << 20;
    o.user_uid = ::geteuid();
    names_.push_back(o.name);
    auto a = shm::Arena::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }
  std::unique_ptr<shm::BeaconWriter> Writer(const std::string& job,
                                            uint32_t rank) {
    auto w = shm::BeaconWriter::Open("/" + prefix_ + "." + job + ".r" +
                                     std::to_string(rank));
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? std::move(*w) : nullptr;
  }
  coord::v1::RankProgress Only(Clock::time_point now) {
    auto snap = monitor_->Snapshot(now);
    EXPECT_EQ(snap.size(), 1u);
    return snap.empty() ? coord::v1::RankProgress() : snap[0];
  }

  std::string prefix_;
  std::vector<std::string> names_;
  std::unique_ptr<BeaconMonitor> monitor_;
  Clock::time_point t0_ = Clock::now();
};

TEST_F(BeaconMonitorTest, StepTimesAndTheTimeSinceTheLastAdvance) {
  auto arena = CreateArena("j", 3);
  auto w = Writer("j", 3);
  monitor_->SetHosted({{"j", {3}}});
  // 100 steps of 200 ms, then one of 1000 ms.
  for (int step = 1; step <= 100; ++step) {
    w->Progress(step, 150'000'000);
    monitor_->PollOnce(t0_ + milliseconds(200 * step));
  }
  w->Progress(101, 150'000'000);
  monitor_->PollOnce(t0_ + milliseconds(20'000 + 1000));
  auto p = Only(t0_ + milliseconds(21'000 + 700));
  EXPECT_TRUE(p.has_step());
  EXPECT_EQ(p.step(), 101u);
  EXPECT_EQ(p.ms_since_advance(), 700u);
  EXPECT_EQ(p.step_ms_p50(), 200u);
  EXPECT_EQ(p.step_ms_p99(), 200u);  // one slow step in 100 is the top 1%
  EXPECT_EQ(p.step_samples(), 100u);
  EXPECT_EQ(p.compute_ms(), 150u);
}

TEST_F(BeaconMonitorTest, SeveralStepsBetweenPollsAreOneInterval) {
  auto arena = CreateArena("j", 0);
  auto w = Writer("j", 0);
  monitor_->SetHosted({{"j", {0}}});
  w->Progress(10, 0);
  monitor_->PollOnce(t0_);
  w->Progress(14, 0);
  monitor_->PollOnce(t0_ + milliseconds(400));
  auto p = Only(t0_ + milliseconds(400));
  EXPECT_EQ(p.step_ms_p50(), 400u);  // what a deadline must cover
  EXPECT_EQ(p.ms_since_advance(), 0u);
}

TEST_F(BeaconMonitorTest, APauseCountsOnceAndEndsWithTheNextAdvance) {
  auto arena = CreateArena("j", 0);
  auto w = Writer("j", 0);
  monitor_->SetHosted({{"j", {0}}});
  w->Progress(1, 0);
  monitor_->PollOnce(t0_);
  w->ExpectPause(60'000, "evaluation");
  monitor_->PollOnce(t0_ + milliseconds(100));
  w->ExpectPause(600'000, "again");  // a second one in the same step
  monitor_->PollOnce(t0_ + milliseconds(200));
  auto p = Only(t0_ + milliseconds(1100));
  ASSERT_TRUE(p.has_pause());
  EXPECT_EQ(p.pause_ms(), 60'000u);
  EXPECT_EQ(p.ms_since_pause(), 1000u);
  EXPECT_EQ(p.pause_reason(), "evaluation");
  w->Progress(2, 0);
  monitor_->PollOnce(t0_ + milliseconds(2000));
  EXPECT_FALSE(Only(t0_ + milliseconds(2000)).has_pause());
}

TEST_F(BeaconMonitorTest, ASaveIsProgressForATrainerWithoutBeacons) {
  auto arena = CreateArena("j", 1);
  monitor_->SetHosted({{"j", {1}}});
  monitor_->PollOnce(t0_);
  EXPECT_FALSE(Only(t0_).has_step());
  arena->SetSlotState(0, shm::SlotState::kStaged, 5, 0, 4096);
  monitor_->PollOnce(t0_ + milliseconds(100));
  arena->SetSlotState(1, shm::SlotState::kStaged, 6, 0, 4096);
  monitor_->PollOnce(t0_ + milliseconds(600));
  auto p = Only(t0_ + milliseconds(900));
  EXPECT_EQ(p.step(), 6u);
  EXPECT_EQ(p.ms_since_advance(), 300u);
  EXPECT_EQ(p.step_ms_p50(), 500u);
}

TEST_F(BeaconMonitorTest, AnArenaThatAppearsLaterIsFoundAndARestartResets) {
  BeaconMonitorOptions o;
  o.shm_prefix = prefix_;
  o.reopen = milliseconds(0);
  monitor_ = std::make_unique<BeaconMonitor>(o);
  monitor_->SetHosted({{"j", {2}}});
  monitor_->PollOnce(t0_);  // no arena yet
  EXPECT_FALSE(Only(t0_).has_step());
  auto arena = CreateArena("j", 2);
  auto w = Writer("j", 2);
  w->Progress(7, 0);
  monitor_->PollOnce(t0_ + milliseconds(100));
  w->Progress(8, 0);
  monitor_->PollOnce(t0_ + milliseconds(300));
  EXPECT_EQ(Only(t0_ + milliseconds(300)).step_samples(), 1u);
  w->Progress(3, 0);  // a restarted trainer restored step 3
  monitor_->PollOnce(t0_ + milliseconds(500));
  auto p = Only(t0_ + milliseconds(500));
  EXPECT_EQ(p.step(), 3u);
  EXPECT_EQ(p.step_samples(), 0u);
  EXPECT_EQ(p.ms_since_advance(), 0u);
  monitor_->SetHosted({});
  EXPECT_TRUE(monitor_->Snapshot(t0_).empty());
}

}  // namespace
}  // namespace ckpt::daemon
