// CallGroups (call_groups.h): calls queued while a group runs are applied
// together in the next group, each exactly once, and every caller returns
// with its own call finished.
#include "coordinator/call_groups.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace ckpt::coordinator {
namespace {

struct Call {
  int id = 0;
  int applied = 0;   // times a group applied it
  int finished = 0;  // times a group's second half answered it
};

// Applies groups one at a time; the first group waits for `release`
// (after saying it `started`) so that calls queue behind it.
struct Recorder {
  absl::Notification started, release;
  std::vector<size_t> sizes;  // written by one group at a time
  std::atomic<int> in_apply{0};
  bool finish = true;

  std::function<void()> operator()(const std::vector<Call*>& group) {
    EXPECT_EQ(in_apply.fetch_add(1), 0) << "one group applied at a time";
    sizes.push_back(group.size());
    for (Call* c : group) ++c->applied;
    if (sizes.size() == 1) {
      started.Notify();
      release.WaitForNotification();
    }
    in_apply.fetch_sub(1);
    if (!finish) return nullptr;  // nothing to finish
    return [group] {
      for (Call* c : group) ++c->finished;
    };
  }
};

// Call 0 runs alone in the first group; calls 1..n-1 queue behind it.
std::vector<size_t> RunQueuedBehindOne(size_t max_group, Recorder& rec,
                                       std::vector<Call>& calls) {
  CallGroups<Call> groups(max_group);
  auto apply = [&rec](const std::vector<Call*>& group) { return rec(group); };
  std::thread first([&] { groups.Run(&calls[0], apply); });
  rec.started.WaitForNotification();
  std::vector<std::thread> rest;
  for (size_t i = 1; i < calls.size(); ++i)
    rest.emplace_back([&, i] { groups.Run(&calls[i], apply); });
  groups.AwaitWaiting(calls.size() - 1);
  rec.release.Notify();
  first.join();
  for (std::thread& t : rest) t.join();
  return rec.sizes;
}

TEST(CallGroupsTest, CallsQueuedWhileAGroupRunsGoTogetherInTheNext) {
  Recorder rec;
  std::vector<Call> calls(8);
  for (int i = 0; i < 8; ++i) calls[i].id = i;
  const std::vector<size_t> sizes = RunQueuedBehindOne(64, rec, calls);
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 7}))
      << "the seven queued calls in one group";
  for (const Call& c : calls) {
    EXPECT_EQ(c.applied, 1) << "call " << c.id;
    EXPECT_EQ(c.finished, 1) << "call " << c.id;
  }
}

TEST(CallGroupsTest, AGroupTakesAtMostMaxGroupAndTheRestFollow) {
  Recorder rec;
  rec.finish = false;
  std::vector<Call> calls(8);
  const std::vector<size_t> sizes = RunQueuedBehindOne(3, rec, calls);
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 3, 3, 1}));
  for (const Call& c : calls) EXPECT_EQ(c.applied, 1);
}

}  // namespace
}  // namespace ckpt::coordinator
