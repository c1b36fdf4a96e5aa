// Recovery plans with peer replicas: a node loss restores the
// newer step a live holder keeps, with each rank's source in the PREFETCH
// and event RESTORE_SOURCES; storage when no live copy is left; a cordoned
// node's own slot; trainers that start while the prefetch runs; metrics.
#include <prometheus/text_serializer.h>

#include <map>
#include <string>

#include "coordinator/replica_testing.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

using ckpt::testing::SampleValue;
using Labels = std::map<std::string, std::string>;

TEST_F(ReplicaTest, NodeLossRestoresTheNewerMemoryStepFromTheReplicaHolder) {
  StageAndReplicate();
  EXPECT_EQ(Memory().memory_step(), 12u);
  EXPECT_EQ(Memory().replicated_ranks(), 2u);
  Silence({"n2"});
  v1::JobRecord j = Job();
  EXPECT_EQ(j.rank_node(2), "s1");
  ASSERT_TRUE(j.has_restore_step());
  EXPECT_EQ(j.restore_step(), 12u);  // storage alone: 10
  auto spare = Heartbeat("s1", es_);
  ASSERT_TRUE(spare.ok()) << spare.status();
  v1::Order prefetch = OrderOf(*spare, v1::PREFETCH);
  EXPECT_EQ(prefetch.step(), 12u);
  ASSERT_EQ(prefetch.ranks_size(), 2);
  ASSERT_EQ(prefetch.sources_size(), 2);
  ASSERT_EQ(prefetch.shard_keys_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(prefetch.sources(i).node_id(), "n3");
    EXPECT_EQ(prefetch.sources(i).host(), "n3");
    EXPECT_EQ(prefetch.sources(i).port(), kPortBase + 3);
    EXPECT_TRUE(prefetch.sources(i).replica());
  }
  EXPECT_EQ(OrderOf(*spare, v1::RESTART).step(), 12u);
  // The survivor restores 12 from its own memory and keeps it.
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_EQ(survivor->orders_size(), 1);
  EXPECT_EQ(survivor->orders(0).step(), 12u);
  ASSERT_EQ(survivor->assignments_size(), 1);
  EXPECT_EQ(survivor->assignments(0).restore_step(), 12u);
  EXPECT_EQ(Job().last_good_step(), 10u);  // last good is still storage's

  std::vector<v1::Event> where = EventsOf(v1::RESTORE_SOURCES);
  ASSERT_EQ(where.size(), 1u);
  const v1::RestoreSources& rs = where[0].restore();
  EXPECT_EQ(rs.step(), 12u);
  EXPECT_TRUE(rs.from_memory());
  EXPECT_EQ(rs.durable_step(), 10u);
  EXPECT_EQ(rs.steps_lost(), 0u);
  EXPECT_EQ(rs.steps_lost_durable(), 2u);
  ASSERT_EQ(rs.ranks_size(), 2);
  EXPECT_EQ(rs.ranks(0).rank(), 2u);
  EXPECT_EQ(rs.ranks(0).node_id(), "n3");
  EXPECT_EQ(rs.ranks(0).copy(), "replica");
  EXPECT_NE(where[0].detail().find("rank 2 from replica on n3"),
            std::string::npos)
      << where[0].detail();
}

// replicated_step: the newest step whose every rank has a verified copy on
// a live holder, so the loss of any one node restores it from memory. A
// count of replicated ranks (of any kept step) cannot say that: it counts
// a rank whose newest copy is of an older step.
TEST_F(ReplicaTest, ReplicatedStepIsTheNewestStepEveryRankHasACopyOf) {
  StageAndReplicate();  // step 12: n2's ranks on n3; n1's nowhere
  EXPECT_EQ(Memory().replicated_ranks(), 2u);
  EXPECT_FALSE(Memory().has_replicated_step());
  for (uint32_t r : {0u, 1u}) ASSERT_TRUE(Replicated("n2", 12, r, "n1").ok());
  EXPECT_TRUE(Memory().has_replicated_step());
  EXPECT_EQ(Memory().replicated_step(), 12u);
  // Step 13: staged everywhere, three ranks copied. Every rank counts as
  // replicated, yet 13 is not what a node loss keeps.
  ReportAll(13, v1::STAGED);
  for (uint32_t r : {0u, 1u, 2u}) {
    const std::string holder = r < 2 ? "n2" : "n3";
    const std::string source = r < 2 ? "n1" : "n2";
    ASSERT_TRUE(Replicated(holder, 13, r, source).ok());
  }
  EXPECT_EQ(Memory().memory_step(), 13u);
  EXPECT_EQ(Memory().replicated_ranks(), 4u);
  EXPECT_EQ(Memory().replicated_step(), 12u);
  ASSERT_TRUE(Replicated("n3", 13, 3, "n2").ok());
  EXPECT_EQ(Memory().replicated_step(), 13u);
  auto text = prometheus::TextSerializer().Serialize(
      coord_->options().metrics->Collect());
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_replicated_step",
                        {{"ckpt_job", "job"}}),
            13.0)
      << text;
  // n3 dies with ranks 2 and 3's copies: no step is copied whole.
  Silence({"n3"});
  EXPECT_FALSE(Memory().has_replicated_step());
}

TEST_F(ReplicaTest, MetricsCountReplicatedRanksAndWhereAPlanFetchedFrom) {
  StageAndReplicate();
  auto text = [&] {
    return prometheus::TextSerializer().Serialize(
        coord_->options().metrics->Collect());
  };
  const Labels job{{"ckpt_job", "job"}};
  std::string t = text();
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_replicated_ranks", job), 2.0) << t;
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_memory_restorable_step", job),
            12.0)
      << t;
  Silence({"n2"});
  t = text();
  EXPECT_EQ(SampleValue(t, "ckpt_coordinator_restore_sources_total",
                        {{"ckpt_job", "job"}, {"copy", "replica"}}),
            2.0)
      << t;
}

TEST_F(ReplicaTest, WithoutReplicasTheSameLossRestoresTheDurableStep) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(12, v1::STAGED);
  Silence({"n2"});
  EXPECT_EQ(Job().restore_step(), 10u);
}

TEST_F(ReplicaTest, NodeAndItsHolderLostTogetherFallBackToStorage) {
  StageAndReplicate();
  Silence({"n2", "n3"});
  EXPECT_EQ(Job().restore_step(), 10u);
  EXPECT_EQ(Memory().replicated_ranks(), 0u);  // died with n3
  v1::Order prefetch = OrderOf(*Heartbeat("s1", es_), v1::PREFETCH);
  EXPECT_EQ(prefetch.step(), 10u);
  ASSERT_EQ(prefetch.sources_size(), 2);
  EXPECT_EQ(prefetch.sources(0).host(), "");  // the shared root
  EXPECT_EQ(prefetch.shard_keys(0), "job/step-10/rank-2");
  std::vector<v1::Event> where = EventsOf(v1::RESTORE_SOURCES);
  ASSERT_EQ(where.size(), 1u);
  EXPECT_FALSE(where[0].restore().from_memory());
  EXPECT_EQ(where[0].restore().ranks(0).copy(), "storage");
  EXPECT_EQ(where[0].restore().steps_lost(), 2u);
}

TEST_F(ReplicaTest, AHolderThatDiedFirstTakesItsReplicasWithIt) {
  StageAndReplicate();
  Silence({"n3"});
  EXPECT_EQ(Memory().replicated_ranks(), 0u);
  // 12 is still in its hosts' memory, but n2's copy is its only one.
  EXPECT_EQ(Memory().memory_step(), 12u);
  EXPECT_NE(Heartbeat("n2", e2_)->replica_target().node_id(), "n3");
  Silence({"n2"});
  EXPECT_EQ(Job().restore_step(), 10u);
}

TEST_F(ReplicaTest, ACordonedNodeServesItsOwnSlotToTheRanksThatLeftIt) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(12, v1::STAGED);  // no replica: n2's memory is the only copy
  v1::CordonRequest cordon;
  cordon.set_node_id("n2");
  cordon.set_reason("ECC errors");
  ASSERT_TRUE(coord_->Cordon(cordon).ok());
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().restore_step(), 12u);
  v1::Order prefetch = OrderOf(*Heartbeat("s1", es_), v1::PREFETCH);
  ASSERT_EQ(prefetch.sources_size(), 2);
  EXPECT_EQ(prefetch.sources(0).node_id(), "n2");
  EXPECT_FALSE(prefetch.sources(0).replica());
  EXPECT_EQ(EventsOf(v1::RESTORE_SOURCES)[0].restore().ranks(0).copy(),
            "own slot");
}

TEST_F(ReplicaTest, TrainersStartOnceRestartsAreAckedWhilePrefetchRuns) {
  StageAndReplicate();
  Silence({"n2"});
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());
  auto spare = Heartbeat("s1", es_);
  auto survivor = Heartbeat("n1", e1_);
  const uint64_t prefetch = OrderOf(*spare, v1::PREFETCH).id();
  ASSERT_TRUE(Heartbeat("s1", es_, {OrderOf(*spare, v1::RESTART).id()}).ok());
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());  // n1's
  ASSERT_TRUE(Heartbeat("n1", e1_, {survivor->orders(0).id()}).ok());
  v1::JobView view = coord_->View("job", "s1");
  EXPECT_TRUE(view.trainers_may_start());
  EXPECT_EQ(view.plan_state(), v1::PLAN_ORDERED);  // the prefetch still counts
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  ASSERT_TRUE(Heartbeat("s1", es_, {prefetch}).ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ACKNOWLEDGED);
}

TEST_F(ReplicaTest, WithoutEarlyStartTrainersWaitForEveryAcknowledgement) {
  start_trainers_with_prefetch_ = false;
  Reopen();
  StageAndReplicate();
  Silence({"n2"});
  auto spare = Heartbeat("s1", es_);
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_TRUE(Heartbeat("s1", es_, {OrderOf(*spare, v1::RESTART).id()}).ok());
  ASSERT_TRUE(Heartbeat("n1", e1_, {survivor->orders(0).id()}).ok());
  EXPECT_FALSE(coord_->View("job", "s1").trainers_may_start());
}

}  // namespace
}  // namespace ckpt::coordinator

namespace ckpt::coordinator {
namespace {

// A report as a node's engine sends it, with the save's generation.
absl::Status ReportOfGeneration(Coordinator& c, const std::string& node,
                                uint64_t epoch, uint64_t step, uint32_t rank,
                                v1::ShardState state, uint64_t generation,
                                uint64_t digest) {
  v1::ReportShardRequest req;
  req.set_node_id(node);
  req.set_epoch(epoch);
  req.set_job("job");
  req.set_step(step);
  req.set_rank(rank);
  req.set_state(state);
  req.set_bytes(1000 + rank);
  req.set_checksum_digest(digest);
  req.set_generation(generation);
  if (state == v1::DURABLE)
    req.set_key(storage::ShardKey("job", step, rank, node));
  return c.ReportShard(req).status();
}

// A spare that fetched the plan's restore step from a peer holds a copy of
// the save the plan chose, stamped with that save's (older) generation: its
// reports of it count, so that a second failure restores the step from the
// spare instead of falling back. A report of another save of that step, or
// of a step after it, is still of an abandoned timeline.
TEST_F(ReplicaTest, SparesFetchedCopyOfTheRestoreStepCountsAsASource) {
  auto exit = coord_->ReportTrainerExit([&] {
    v1::ReportTrainerExitRequest e;
    e.set_node_id("n1");
    e.set_epoch(e1_);
    e.set_job("job");
    e.set_rank(0);
    e.set_exit_code(1);
    return e;
  }());
  ASSERT_TRUE(exit.ok()) << exit.status();
  const uint64_t gen = Job().generation();
  ASSERT_GT(gen, 0u);
  for (uint64_t step : {10u, 12u})
    for (v1::ShardState state : {v1::STAGED, v1::DURABLE}) {
      if (step == 12 && state == v1::DURABLE) continue;
      for (uint32_t r = 0; r < 4; ++r) {
        const std::string node = r < 2 ? "n1" : "n2";
        ASSERT_TRUE(ReportOfGeneration(*coord_, node, EpochOf(node), step, r,
                                       state, gen, 0xabc0 + r)
                        .ok());
      }
    }
  for (uint32_t r : {2u, 3u})
    ASSERT_TRUE(Replicated("n3", 12, r, "n2", [&](v1::ShardReport& rep) {
                  rep.set_generation(gen);
                }).ok());
  Silence({"n2"});
  ASSERT_EQ(Job().restore_step(), 12u);
  ASSERT_EQ(Job().rank_node(2), "s1");
  ASSERT_GT(Job().generation(), gen);

  absl::Status other =
      ReportOfGeneration(*coord_, "s1", es_, 12, 2, v1::STAGED, gen, 0xdead);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  absl::Status later =
      ReportOfGeneration(*coord_, "s1", es_, 13, 2, v1::STAGED, gen, 0xabc2);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  for (uint32_t r : {2u, 3u})
    for (v1::ShardState state : {v1::STAGED, v1::DURABLE}) {
      absl::Status s =
          ReportOfGeneration(*coord_, "s1", es_, 12, r, state, gen, 0xabc0 + r);
      EXPECT_TRUE(s.ok()) << "the spare's copy of rank " << r << ": " << s;
    }
  // The holder of the replicas dies too, and a trainer fails: step 12 is
  // still whole, on n1 and on the spare.
  Silence({"n3"});
  auto again = coord_->ReportTrainerExit([&] {
    v1::ReportTrainerExitRequest e;
    e.set_node_id("s1");
    e.set_epoch(es_);
    e.set_job("job");
    e.set_rank(2);
    e.set_exit_code(1);
    return e;
  }());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Job().restore_step(), 12u)
      << "the spare's copy of step 12 was not counted";
}

}  // namespace
}  // namespace ckpt::coordinator
