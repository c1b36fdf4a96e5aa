// Progress beacons through a real ckptd: what a trainer's Progress and
// ExpectPause store is what the daemon's read-only view of the arena sees.
#include <gtest/gtest.h>

#include "shm/beacon.h"
#include "tests/daemon_test.h"
#include "tests/harness.h"

namespace ckpt::testing {
namespace {

class ProgressBeaconTest : public DaemonTest {
 protected:
  std::unique_ptr<shm::BeaconView> View(const std::string& job, int rank) {
    auto view = shm::BeaconView::Open(
        "/" + prefix_ + "." + job + ".r" + std::to_string(rank), job, rank);
    EXPECT_TRUE(view.ok()) << view.status();
    return view.ok() ? std::move(*view) : nullptr;
  }
};

TEST_F(ProgressBeaconTest, ProgressBeforeTheFirstSaveReachesTheArenaWithIt) {
  auto client = Connect("beacon", 1, 2);
  ASSERT_NE(client, nullptr);
  client->Progress(4, 0.25);  // no arena yet: kept in the process
  HostState s = MakeState(1 << 20, 3, 1);
  ASSERT_TRUE(client->Save(5, s.tensors).ok());
  auto view = View("beacon", 1);
  ASSERT_NE(view, nullptr);
  auto snap = view->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->step, 4);
  EXPECT_EQ(snap->compute_ns, 250'000'000u);
  EXPECT_EQ(view->NewestSlotStep(), std::optional<uint64_t>(5));  // the save

  client->Progress(6);
  client->ExpectPause(120, "evaluation");
  snap = view->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->step, 6);
  EXPECT_EQ(snap->compute_ns, 0u);
  EXPECT_EQ(snap->pause_ms, 120'000u);
  EXPECT_EQ(snap->pause_reason, "evaluation");
}

TEST_F(ProgressBeaconTest, NonsenseTimesAreNotReported) {
  auto client = Connect("beacon2");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(1 << 20, 3, 1);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  client->Progress(2, -1.0);
  client->ExpectPause(-5, "x");
  auto view = View("beacon2", 0);
  ASSERT_NE(view, nullptr);
  auto snap = view->Read();
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->compute_ns, 0u);
  EXPECT_EQ(snap->pause_ms, 0u);
}

}  // namespace
}  // namespace ckpt::testing
