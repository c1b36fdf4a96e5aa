// The job table (daemon/state/job_table.h) on its own, with real arenas: the
// checks every request starts with name the field and the owner, a first
// Register's job stays unrecorded until it has an arena, a shard's phase
// is mirrored into the slot that holds it (the arena's header included),
// and completeness counts only the ranks this node hosts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/state/job_table.h"
#include "shm/arena.h"
#include "tests/harness.h"

namespace ckpt::testing {
namespace {

using daemon::Job;
using daemon::JobTable;
using daemon::PeerCreds;
using daemon::Shard;
using daemon::ShardPhase;

class JobTableTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : names_) (void)shm::Arena::Unlink(n);
  }
  // A two-slot arena for (job, rank), installed in the rank's slot table.
  void InstallArena(Job& job, uint32_t rank) {
    shm::ArenaOptions o;
    o.name = "/" + prefix_ + "." + job.rec.job() + ".r" + std::to_string(rank);
    o.job = job.rec.job();
    o.rank = rank;
    o.world_size = job.rec.world_size();
    o.slot_bytes = 1 << 20;
    o.num_slots = 2;
    o.user_uid = ::geteuid();
    names_.push_back(o.name);
    auto a = shm::Arena::Create(o);
    ASSERT_TRUE(a.ok()) << a.status();
    job.ranks[rank].Install(std::shared_ptr<shm::Arena>(std::move(*a)));
  }
  static Shard NewShard(const std::string& job, uint64_t step, uint32_t rank,
                        ShardPhase first) {
    Shard s;
    s.rec.set_job(job);
    s.rec.set_step(step);
    s.rec.set_rank(rank);
    s.Start(first);
    return s;
  }

  const std::string prefix_ = UniqueShmPrefix();
  std::vector<std::string> names_;
  JobTable table_;
};

TEST_F(JobTableTest, FindForNamesTheFieldAndTheOwner) {
  JobTable::Lock lock(&table_);
  ASSERT_TRUE(table_.FindOrAdd("train", 1000, 2, 3).ok());
  const PeerCreds owner{1, 1000, 1000}, other{1, 1001, 1001}, root{1, 0, 0};

  auto unknown = table_.FindFor("other", owner);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("job: unknown job 'other'"),
            std::string::npos)
      << unknown.status();
  auto invalid = table_.FindFor("../x", owner);
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  auto denied = table_.FindFor("train", other);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(denied.status().message().find("belongs to uid 1000, caller is "
                                           "uid 1001"),
            std::string::npos)
      << denied.status();
  ASSERT_TRUE(table_.FindFor("train", owner).ok());
  ASSERT_TRUE(table_.FindFor("train", root).ok());
}

TEST_F(JobTableTest, AFirstRegistersJobIsUnrecordedUntilItHasAnArena) {
  JobTable::Lock lock(&table_);
  auto job = table_.FindOrAdd("train", 1000, 2, 3);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_FALSE((*job)->recorded);
  EXPECT_EQ((*job)->rec.uid(), 1000u);
  EXPECT_EQ((*job)->rec.num_slots(), 3u);
  // The same job again: the same entry; another owner: no.
  auto again = table_.FindOrAdd("train", 1000, 2, 5);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *job);
  EXPECT_EQ(table_.FindOrAdd("train", 1001, 2, 3).status().code(),
            absl::StatusCode::kPermissionDenied);
  // Another world size with no generation (a trainer started by hand with
  // the wrong size): refused naming world_size, nothing changed.
  auto world = table_.FindOrAdd("train", 1000, 4, 3);
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(world.status().message().find("world_size: 4, but job 'train' "
                                          "has 2"),
            std::string::npos)
      << world.status();
  EXPECT_EQ((*job)->rec.world_size(), 2u);
  // A generation registers the job at its size; another size under the
  // same generation is refused, under a newer one the job was resized
  // (elastic continuation): the same entry, at its trainers' new size.
  ASSERT_TRUE(table_.FindOrAdd("train", 1000, 2, 3, 5).ok());
  auto same = table_.FindOrAdd("train", 1000, 4, 3, 5);
  EXPECT_EQ(same.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(same.status().message().find("this trainer's is 5, the job's 5"),
            std::string::npos)
      << same.status();
  EXPECT_EQ((*job)->rec.world_size(), 2u);
  auto resized = table_.FindOrAdd("train", 1000, 4, 3, 6);
  ASSERT_TRUE(resized.ok()) << resized.status();
  EXPECT_EQ(*resized, *job);
  EXPECT_EQ((*job)->rec.world_size(), 4u);
  // An older generation's trainer (a survivor of the old size) cannot
  // size it back.
  EXPECT_EQ(table_.FindOrAdd("train", 1000, 2, 3, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*job)->rec.world_size(), 4u);

  // While one of its arenas is being created it stays; without any, it goes.
  (*job)->ranks[0].creating = true;
  table_.EraseIfUnrecorded("train");
  ASSERT_NE(table_.Find("train"), nullptr);
  (*job)->ranks[0].creating = false;
  table_.EraseIfUnrecorded("train");
  EXPECT_EQ(table_.Find("train"), nullptr);
}

TEST_F(JobTableTest, FindRankNamesTheRank) {
  JobTable::Lock lock(&table_);
  Job* job = *table_.FindOrAdd("train", ::geteuid(), 2, 2);
  auto beyond = JobTable::FindRank(*job, 2);
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(beyond.status().message().find("rank: 2 is not below world_size "
                                           "2"),
            std::string::npos);
  EXPECT_EQ(JobTable::FindRank(*job, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  InstallArena(*job, 1);
  auto rank = JobTable::FindRank(*job, 1);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, &job->ranks[1]);
}

TEST_F(JobTableTest, MoveShardMirrorsThePhaseIntoItsSlotAndTheArena) {
  JobTable::Lock lock(&table_);
  Job* job = *table_.FindOrAdd("train", ::geteuid(), 1, 2);
  InstallArena(*job, 0);
  daemon::RankSlots& rank = job->ranks[0];
  Shard& shard = job->steps[7].shards[0] =
      NewShard("train", 7, 0, ShardPhase::kStaged);
  shard.gen = table_.NextGen();
  shard.slot = 0;
  rank.Hold(0, daemon::SlotStateOf(shard.phase), 7, shard.gen, 4096);

  ASSERT_TRUE(table_.MoveShard(*job, shard, ShardPhase::kPersisting));
  EXPECT_EQ(rank.slots[0].state, shm::SlotState::kPersisting);
  EXPECT_EQ(rank.arena->slot_state(0), shm::SlotState::kPersisting);
  EXPECT_EQ(shard.rec.state(), daemon::catv1::ShardRecord::STAGED);

  ASSERT_TRUE(table_.MoveShard(*job, shard, ShardPhase::kDurable));
  EXPECT_EQ(rank.slots[0].state, shm::SlotState::kDurable);
  EXPECT_EQ(rank.arena->slot_state(0), shm::SlotState::kDurable);
  EXPECT_EQ(shard.rec.state(), daemon::catv1::ShardRecord::DURABLE);

  // Illegal: durable never goes back to persisting; nothing changes.
  EXPECT_FALSE(table_.MoveShard(*job, shard, ShardPhase::kPersisting));
  EXPECT_EQ(shard.phase, ShardPhase::kDurable);
  EXPECT_EQ(rank.slots[0].state, shm::SlotState::kDurable);

  // A shard in no slot changes no slot.
  Shard& other = job->steps[8].shards[0] =
      NewShard("train", 8, 0, ShardPhase::kStaged);
  ASSERT_TRUE(table_.MoveShard(*job, other, ShardPhase::kPersisting));
  EXPECT_EQ(rank.slots[1].state, shm::SlotState::kFree);
  EXPECT_EQ(table_.NotDurable(), 1u);
}

TEST_F(JobTableTest, CompletenessCountsOnlyTheHostedRanks) {
  JobTable::Lock lock(&table_);
  Job* job = *table_.FindOrAdd("train", 1000, 2, 2);
  job->steps[3].shards[0] = NewShard("train", 3, 0, ShardPhase::kDurable);
  const daemon::Step& step = job->steps[3];
  bool durable = true;
  EXPECT_FALSE(table_.StepComplete(*job, step, &durable));
  EXPECT_FALSE(durable);

  EXPECT_EQ(table_.HostingOf("train"), nullptr);
  EXPECT_TRUE(table_.SetHosting("train", daemon::Hosting{{0}, 3}));
  EXPECT_FALSE(table_.SetHosting("train", daemon::Hosting{{0}, 3}));
  ASSERT_NE(table_.HostingOf("train"), nullptr);
  EXPECT_TRUE(table_.StepComplete(*job, step, &durable));
  EXPECT_TRUE(durable);
  EXPECT_EQ(table_.NotDurable(), 0u);
}

TEST_F(JobTableTest, ACommittedSaveHoldsItsSlotUntilItsImageIsDropped) {
  JobTable::Lock lock(&table_);
  Job* job = *table_.FindOrAdd("train", ::geteuid(), 1, 2);
  InstallArena(*job, 0);
  daemon::RankSlots& rank = job->ranks[0];
  job->forget_when_idle = true;
  Shard committed = NewShard("train", 5, 0, ShardPhase::kStaged);
  committed.slot = 1;
  committed.info.layout.image_bytes = 4096;
  const uint64_t gen = table_.AddCommitted(*job, rank, 1, std::move(committed));
  Shard* shard = table_.FindShard("train", 5, 0);
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->gen, gen);
  EXPECT_FALSE(job->forget_when_idle);
  EXPECT_EQ(rank.slots[1].state, shm::SlotState::kStaged);
  EXPECT_EQ(rank.slots[1].gen, gen);
  EXPECT_EQ(rank.arena->slot_state(1), shm::SlotState::kStaged);
  // A newer generation for the same step and rank replaces it.
  Shard again = NewShard("train", 5, 0, ShardPhase::kStaged);
  again.slot = 0;
  EXPECT_GT(table_.AddCommitted(*job, rank, 0, std::move(again)), gen);
  EXPECT_EQ(job->steps[5].shards.size(), 1u);
  shard = table_.FindShard("train", 5, 0);
  ASSERT_TRUE(table_.MoveShard(*job, *shard, ShardPhase::kPersisting));
  ASSERT_TRUE(table_.MoveShard(*job, *shard, ShardPhase::kDurable));

  // Its image failed verification: the slot frees, the shard stays
  // (restorable from storage).
  JobTable::DropImage(*job, *shard);
  EXPECT_EQ(shard->slot, -1);
  EXPECT_EQ(rank.slots[0].state, shm::SlotState::kFree);
  EXPECT_EQ(shard->phase, ShardPhase::kDurable);

  // Failing for good records why, once.
  EXPECT_TRUE(table_.FailShard(*shard, "every copy failed"));
  EXPECT_EQ(shard->phase, ShardPhase::kFailed);
  EXPECT_EQ(shard->rec.error(), "every copy failed");
  EXPECT_FALSE(table_.FailShard(*shard, "again"));
  EXPECT_EQ(shard->rec.error(), "every copy failed");
}

}  // namespace
}  // namespace ckpt::testing
