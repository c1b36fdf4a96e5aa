// AddAssignments alone: a node is told its ranks as of the last durable
// commit, never a change still on its way to disk.
#include "coordinator/assignments.h"

#include <gtest/gtest.h>

namespace ckpt::coordinator {
namespace {

TEST(AssignmentsTest, ANodeGetsItsDurableRanksPerJob) {
  std::map<std::string, JobState> jobs;
  JobState& a = jobs["a"];
  a.durable_rec.set_job("a");
  a.durable_rec.set_world_size(3);
  a.durable_rec.set_generation(2);
  a.durable_rec.set_has_last_good(true);
  a.durable_rec.set_last_good_step(40);
  a.durable_rec.set_has_restore_step(true);
  a.durable_rec.set_restore_step(50);
  a.durable_ranks_by_node = {{"n1", {0, 2}}, {"n2", {1}}};
  // A plan moved rank 1 to n1, not yet durable: n1 is not told yet.
  a.ranks_by_node = {{"n1", {0, 1, 2}}};
  JobState& b = jobs["b"];
  b.durable_rec.set_job("b");
  b.durable_ranks_by_node = {{"n2", {0}}};

  coord::v1::HeartbeatResponse resp;
  AddAssignments(jobs, "n1", &resp);
  ASSERT_EQ(resp.assignments_size(), 1);
  const coord::v1::Assignment& got = resp.assignments(0);
  EXPECT_EQ(got.job(), "a");
  EXPECT_EQ(std::vector<uint32_t>(got.ranks().begin(), got.ranks().end()),
            (std::vector<uint32_t>{0, 2}));
  EXPECT_EQ(got.world_size(), 3u);
  EXPECT_EQ(got.generation(), 2u);
  EXPECT_TRUE(got.has_last_good());
  EXPECT_EQ(got.last_good_step(), 40u);
  EXPECT_TRUE(got.has_restore_step());
  EXPECT_EQ(got.restore_step(), 50u);

  coord::v1::HeartbeatResponse two;
  AddAssignments(jobs, "n2", &two);
  ASSERT_EQ(two.assignments_size(), 2);
  EXPECT_EQ(two.assignments(0).job(), "a");
  EXPECT_EQ(two.assignments(1).job(), "b");

  coord::v1::HeartbeatResponse none;
  AddAssignments(jobs, "n3", &none);
  EXPECT_EQ(none.assignments_size(), 0);
}

}  // namespace
}  // namespace ckpt::coordinator
