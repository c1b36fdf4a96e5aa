// State-machine tests of the Coordinator with a fake clock: global commit,
// failure detection, recovery plans and orders, restart from its state.
#include <atomic>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "coordinator/admission.h"
#include "coordinator/coordinator_testing.h"
#include "storage/manifest.h"

namespace ckpt::coordinator {
namespace {

TEST_F(TwoNodeTest, RanksArePlacedOnActiveNodesByCapacity) {
  v1::JobRecord j = Job();
  ASSERT_EQ(j.rank_node_size(), 4);
  EXPECT_EQ(j.rank_node(0), "n1");
  EXPECT_EQ(j.rank_node(1), "n1");
  EXPECT_EQ(j.rank_node(2), "n2");
  EXPECT_EQ(j.rank_node(3), "n2");
  auto hb = Heartbeat("n2", e2_);
  ASSERT_TRUE(hb.ok());
  ASSERT_EQ(hb->assignments_size(), 1);
  EXPECT_EQ(hb->assignments(0).ranks_size(), 2);
  EXPECT_EQ(hb->assignments(0).ranks(0), 2u);
}

TEST_F(TwoNodeTest, ManifestAndLastGoodOnlyWhenEveryRankIsDurable) {
  ReportAll(10, v1::STAGED);
  for (uint32_t r = 0; r < 3; ++r)
    ASSERT_TRUE(
        Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, 10, r, v1::DURABLE)
            .ok());
  EXPECT_FALSE(Job().has_last_good());
  EXPECT_FALSE(std::filesystem::exists(ManifestPath(10)));
  auto last = Report("n2", e2_, 10, 3, v1::DURABLE);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->durable_everywhere());
  EXPECT_TRUE(Job().has_last_good());
  EXPECT_EQ(Job().last_good_step(), 10u);
  EXPECT_TRUE(HasEvent(v1::STEP_STAGED));
  EXPECT_TRUE(HasEvent(v1::STEP_DURABLE));
  auto m = ReadManifest(10);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards_size(), 4);
  EXPECT_EQ(m->shards(3).bytes(), 1003u);
  EXPECT_EQ(m->shards(3).checksum_digest(), storage::DigestHex(0xabc3));
  EXPECT_EQ(m->shards(3).key(), "job/step-10/rank-3");
}

// Device tensors' checksums are known only once persisted: a DURABLE report
// carries the file's digest and names its save by the STAGED one's. One that
// names another save is refused and changes nothing.
TEST_F(TwoNodeTest, DurableReportNamesItsSaveByTheStagedDigest) {
  ReportAll(10, v1::STAGED);
  for (uint32_t r = 0; r < 3; ++r)
    ASSERT_TRUE(
        Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, 10, r, v1::DURABLE)
            .ok());
  v1::ReportShardRequest req;
  req.set_node_id("n2");
  req.set_epoch(e2_);
  req.set_job("job");
  req.set_step(10);
  req.set_rank(3);
  req.set_state(v1::DURABLE);
  req.set_bytes(1003);
  req.set_key("job/step-10/rank-3");
  req.set_checksum_digest(0xfeed);
  req.set_staged_digest(0xabc4);  // rank 2's: another save
  auto wrong = coord_->ReportShard(req);
  ASSERT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("staged_digest"),
            absl::string_view::npos)
      << wrong.status();
  EXPECT_FALSE(Job().has_last_good());
  req.set_staged_digest(0xabc3);
  auto right = coord_->ReportShard(req);
  ASSERT_TRUE(right.ok()) << right.status();
  ASSERT_TRUE(Job().has_last_good());
  auto m = ReadManifest(10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shards(3).checksum_digest(), storage::DigestHex(0xfeed));
  // A STAGED report re-sent after the DURABLE one (a node re-sending to a
  // new incarnation) still names the same save.
  req.set_state(v1::STAGED);
  req.set_checksum_digest(0xfeed);
  EXPECT_TRUE(coord_->ReportShard(req).ok());
}

TEST_F(TwoNodeTest, SilentNodeIsDeclaredDeadAndSpareGetsPrefetchAndRestart) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(11, v1::STAGED);  // staged only: n2's copy dies with it
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1_).ok());
  ASSERT_TRUE(Heartbeat("s1", es_).ok());
  now_ms_ += 2000;  // n2 silent for 4 s > 3 s
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  v1::JobRecord j = Job();
  EXPECT_EQ(j.rank_node(2), "s1");
  EXPECT_EQ(j.rank_node(3), "s1");
  EXPECT_EQ(j.plan_state(), v1::PLAN_ORDERED);
  ASSERT_TRUE(j.has_restore_step());
  EXPECT_EQ(j.restore_step(), 10u);  // 11 is not restorable on ranks 2 and 3
  auto spare = Heartbeat("s1", es_);
  ASSERT_TRUE(spare.ok());
  ASSERT_EQ(spare->orders_size(), 2);
  EXPECT_EQ(spare->orders(0).kind(), v1::PREFETCH);
  EXPECT_EQ(spare->orders(0).step(), 10u);
  ASSERT_EQ(spare->orders(0).shard_keys_size(), 2);
  EXPECT_EQ(spare->orders(0).shard_keys(0), "job/step-10/rank-2");
  EXPECT_EQ(spare->orders(1).kind(), v1::RESTART);
  auto survivor = Heartbeat("n1", e1_);
  ASSERT_TRUE(survivor.ok());
  ASSERT_EQ(survivor->orders_size(), 1);  // ranks 0, 1 restore from n1's memory
  EXPECT_EQ(survivor->orders(0).kind(), v1::RESTART);
  EXPECT_EQ(survivor->orders(0).step(), 10u);
  EXPECT_TRUE(HasEvent(v1::FAILURE_DETECTED));
  EXPECT_TRUE(HasEvent(v1::PLAN_MADE));
  EXPECT_TRUE(HasEvent(v1::ORDER_SENT));
}

TEST_F(TwoNodeTest, OrdersRepeatUntilAcknowledgedThenPlanIsAcknowledged) {
  ASSERT_TRUE(Report("n1", e1_, 5, 0, v1::STAGED).ok());
  auto r = coord_->ReportTrainerExit(TrainerExit("n1", e1_, 0, 9));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->failure());
  EXPECT_FALSE(Job().has_restore_step());  // step 5 is not on every rank
  auto first = Heartbeat("n1", e1_);
  auto again = Heartbeat("n1", e1_);
  ASSERT_TRUE(first.ok() && again.ok());
  ASSERT_EQ(first->orders_size(), 1);
  ASSERT_EQ(again->orders_size(), 1);
  EXPECT_EQ(first->orders(0).id(), again->orders(0).id());
  EXPECT_FALSE(first->orders(0).has_step());
  auto acked = Heartbeat("n1", e1_, {first->orders(0).id()});
  ASSERT_TRUE(acked.ok());
  EXPECT_EQ(acked->orders_size(), 0);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);  // n2 has not acknowledged
  auto n2 = Heartbeat("n2", e2_);
  ASSERT_TRUE(n2.ok() && n2->orders_size() == 1);
  ASSERT_TRUE(Heartbeat("n2", e2_, {n2->orders(0).id()}).ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ACKNOWLEDGED);
  EXPECT_TRUE(HasEvent(v1::ORDER_ACKED));
  EXPECT_TRUE(HasEvent(v1::PLAN_ACKED));
}

TEST_F(TwoNodeTest, TrainerExitRestoresNewestStepFromMemoryWithoutPrefetch) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(12, v1::STAGED);
  ASSERT_TRUE(coord_->ReportTrainerExit(TrainerExit("n2", e2_, 3, 0, 1)).ok());
  EXPECT_EQ(Job().restore_step(), 12u);
  for (auto [node, epoch] : {std::pair{"n1", e1_}, std::pair{"n2", e2_}}) {
    auto hb = Heartbeat(node, epoch);
    ASSERT_TRUE(hb.ok());
    ASSERT_EQ(hb->orders_size(), 1) << node;
    EXPECT_EQ(hb->orders(0).kind(), v1::RESTART);
    EXPECT_EQ(hb->orders(0).step(), 12u);
  }
}

TEST_F(TwoNodeTest, CleanTrainerExitIsNoFailure) {
  auto r = coord_->ReportTrainerExit(TrainerExit("n1", e1_, 1, 0));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->failure());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_NONE);
}

TEST_F(CoordinatorTest, WithoutSpareLostRanksWaitForTheirNodeToReturn) {
  uint64_t e1 = Register("n1", 1);
  uint64_t e2 = Register("n2", 1);
  RegisterJob("job", 2);
  ASSERT_TRUE(Report("n1", e1, 3, 0, v1::STAGED).ok());
  ASSERT_TRUE(Report("n2", e2, 3, 1, v1::STAGED).ok());
  ASSERT_TRUE(Report("n1", e1, 3, 0, v1::DURABLE).ok());
  ASSERT_TRUE(Report("n2", e2, 3, 1, v1::DURABLE).ok());
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  now_ms_ += 2000;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  EXPECT_TRUE(HasEvent(v1::PLAN_WAITING));
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  EXPECT_EQ(Heartbeat("n1", e1)->orders_size(), 0);
  uint64_t e2b = Register("n2", 1);
  EXPECT_GT(e2b, e2);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().rank_node(1), "n2");
  auto hb = Heartbeat("n2", e2b);
  ASSERT_TRUE(hb.ok());
  ASSERT_EQ(hb->orders_size(), 2);  // its memory was lost with its old epoch
  EXPECT_EQ(hb->orders(0).kind(), v1::PREFETCH);
  EXPECT_EQ(hb->orders(0).step(), 3u);
}

TEST_F(TwoNodeTest, RestartedCoordinatorKnowsNodesEpochsStepsAndOrders) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  ReportAll(11, v1::STAGED);
  now_ms_ += 4000;
  ASSERT_TRUE(
      coord_->Tick().ok());  // everyone dead; no spare left alive either
  uint64_t n1b = Register("n1", 2);
  uint64_t n2b = Register("n2", 2);
  v1::GetClusterResponse before = coord_->GetCluster();
  int events_before = coord_->Events({}).events_size();
  Reopen();
  v1::GetClusterResponse after = coord_->GetCluster();
  ASSERT_EQ(after.nodes_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(after.nodes(i).epoch(), before.nodes(i).epoch());
    EXPECT_EQ(after.nodes(i).health(), before.nodes(i).health());
  }
  EXPECT_EQ(Job().last_good_step(), 10u);
  EXPECT_EQ(Job().generation(), before.jobs(0).generation());
  EXPECT_EQ(coord_->Events({}).events_size(), events_before);
  auto hb = Heartbeat("n2", n2b);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_GE(hb->orders_size(), 1);
  EXPECT_TRUE(Heartbeat("n1", n1b).ok());
  uint64_t s1b = Register("s1", 2, true);
  EXPECT_GT(s1b, n2b);  // epochs never go back
  // Reports carry on from where they were.
  auto rep = Report("n1", n1b, 11, 0, v1::STAGED);
  ASSERT_TRUE(rep.ok()) << rep.status();
}

// A standby that won the election loads the state and only
// then serves; heartbeats sent meanwhile went to a dead leader. Judging a
// node on them made a second plan after every slow failover.
TEST_F(TwoNodeTest,
       NewLeaderGivesEveryNodeAFreshHeartbeatWindowWhenItStartsServing) {
  const uint64_t generation = Job().generation();
  Reopen();         // the new leader loads the state at t0 ...
  now_ms_ += 2500;  // ... and serves only later (a slow load, a loaded machine)
  coord_->StartServing();
  now_ms_ += 1000;  // each node heartbeats within its timeout of that
  for (auto [node, epoch] :
       {std::pair{"n1", e1_}, std::pair{"n2", e2_}, std::pair{"s1", es_}}) {
    auto hb = Heartbeat(node, epoch);
    EXPECT_TRUE(hb.ok()) << node << ": " << hb.status();
  }
  ASSERT_TRUE(coord_->Tick().ok());
  for (const char* node : {"n1", "n2", "s1"})
    EXPECT_EQ(Node(node).health(), v1::ALIVE) << node;
  EXPECT_EQ(Job().generation(), generation);
  EXPECT_FALSE(HasEvent(v1::PLAN_MADE));
  now_ms_ += 2000;  // a node silent for a whole window after that is dead
  ASSERT_TRUE(Heartbeat("n1", e1_).ok());
  ASSERT_TRUE(Heartbeat("s1", es_).ok());
  now_ms_ += 2000;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
}

// The shared root is not there when the coordinator starts (the
// NFS mount is late; its job directory was moved away). A missing job
// directory is no proof that the steps are bad: the coordinator refuses to
// start, naming the path, and forgets nothing.
TEST_F(TwoNodeTest,
       SharedRootMissingAtStartIsRefusedNamingThePathAndForgetsNoGoodStep) {
  for (uint64_t step : {10, 12}) {
    ReportAll(step, v1::STAGED);
    ReportAll(step, v1::DURABLE);
  }
  ASSERT_EQ(Job().last_good_step(), 12u);
  coord_.reset();
  const std::string job_dir = dir_.path() + "/shared/job";
  std::filesystem::rename(job_dir, job_dir + ".x");
  absl::Status s = TryReopen();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find(dir_.path() + "/shared"), absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find("job"), absl::string_view::npos) << s;
  std::filesystem::rename(job_dir + ".x", job_dir);
  Reopen();
  EXPECT_TRUE(Job().has_last_good());
  EXPECT_EQ(Job().last_good_step(), 12u);
  EXPECT_EQ(Job().manifest_steps_size(), 2);
  EXPECT_FALSE(HasEvent(v1::MANIFEST_INVALID));
}

// Waiting: the mount comes while the coordinator starts.
TEST_F(TwoNodeTest, CoordinatorWaitsForALateSharedRootAndKeepsItsGoodSteps) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  coord_.reset();
  const std::string job_dir = dir_.path() + "/shared/job";
  std::filesystem::rename(job_dir, job_dir + ".x");
  std::thread mount([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    std::filesystem::rename(job_dir + ".x", job_dir);
  });
  absl::Status s = TryReopen(std::chrono::seconds(60));
  mount.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(Job().last_good_step(), 10u);
  EXPECT_FALSE(HasEvent(v1::MANIFEST_INVALID));
}

// A manifest that is there but missing one step's file, or
// corrupt, is invalid (the step is dropped) as before.
TEST_F(TwoNodeTest, MissingManifestBesideOthersOfTheJobIsStillInvalid) {
  for (uint64_t step : {10, 12}) {
    ReportAll(step, v1::STAGED);
    ReportAll(step, v1::DURABLE);
  }
  coord_.reset();
  std::filesystem::remove(ManifestPath(12));
  Reopen();
  EXPECT_TRUE(HasEvent(v1::MANIFEST_INVALID));
  EXPECT_EQ(Job().last_good_step(), 10u);
}

// ckptrun's exit report timed out on a loaded machine, the
// leader had made the plan, and the retry (to the new leader) made a second
// one. An exit of a generation already replaced plans nothing.
TEST_F(TwoNodeTest, TrainerExitOfAReplacedGenerationMakesNoSecondPlan) {
  v1::ReportTrainerExitRequest exit = TrainerExit("n2", e2_, 3, 9);
  exit.set_generation(0);
  auto first = coord_->ReportTrainerExit(exit);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->failure());
  EXPECT_EQ(first->generation(), 1u);
  auto retried = coord_->ReportTrainerExit(exit);  // its first answer was lost
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_FALSE(retried->failure());
  EXPECT_EQ(retried->generation(), 1u);
  EXPECT_EQ(Job().generation(), 1u);
  int plans = 0;
  const v1::EventsResponse events = coord_->Events({});
  for (const auto& e : events.events()) plans += e.kind() == v1::PLAN_MADE;
  EXPECT_EQ(plans, 1);
  exit.set_generation(1);  // the new generation's trainer dies: a new plan
  auto again = coord_->ReportTrainerExit(exit);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->failure());
  EXPECT_EQ(Job().generation(), 2u);
}

// A plan restoring the last good step from its manifest (no
// shard records after a restart) must not read the shared root under the
// state mutex: the coordinator keeps the last good manifest it read or
// wrote. Shown with the shared root gone by the time of the plan: the
// spare's PREFETCH still names every shard.
TEST_F(TwoNodeTest, PlanFromTheLastGoodManifestReadsNothingFromTheSharedRoot) {
  ReportAll(10, v1::STAGED);
  ReportAll(10, v1::DURABLE);
  Reopen();  // the shard records (soft state) are gone; the manifest is read
             // here
  const std::string job_dir = dir_.path() + "/shared/job";
  std::filesystem::rename(job_dir,
                          job_dir + ".x");  // a hung or lost mount from now on
  now_ms_ += 2000;
  ASSERT_TRUE(Heartbeat("n1", e1_).ok());
  ASSERT_TRUE(Heartbeat("s1", es_).ok());
  now_ms_ += 2000;  // n2 silent: dead, its ranks go to the spare
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().restore_step(), 10u);
  auto spare = Heartbeat("s1", es_);
  ASSERT_TRUE(spare.ok()) << spare.status();
  ASSERT_GE(spare->orders_size(), 1);
  ASSERT_EQ(spare->orders(0).kind(), v1::PREFETCH);
  ASSERT_EQ(spare->orders(0).shard_keys_size(), 2);
  EXPECT_EQ(spare->orders(0).shard_keys(0), "job/step-10/rank-2");
  EXPECT_EQ(spare->orders(0).shard_keys(1), "job/step-10/rank-3");
  EXPECT_FALSE(HasEvent(v1::MANIFEST_INVALID));
  std::filesystem::rename(job_dir + ".x", job_dir);
}

// The server runs a heartbeat on gRPC's own thread when the state lock is
// free at once (TryHeartbeat; no thread switch to a heartbeat worker), and
// queues it only when the lock is busy. Run there, it answers as the
// queued Heartbeat does.
TEST_F(TwoNodeTest, TryHeartbeatAnswersAsTheQueuedHeartbeatDoes) {
  // A plan, so that the heartbeat has orders to deliver.
  ASSERT_TRUE(Report("n1", e1_, 5, 0, v1::STAGED).ok());
  ASSERT_TRUE(coord_->ReportTrainerExit(TrainerExit("n1", e1_, 0, 9)).ok());
  v1::HeartbeatRequest req;
  req.set_node_id("n1");
  req.set_epoch(e1_);
  uint64_t durable_seq = 7;
  std::optional<absl::StatusOr<v1::HeartbeatResponse>> fast =
      coord_->TryHeartbeat(req, &durable_seq);
  ASSERT_TRUE(fast.has_value()) << "the state lock was free";
  ASSERT_TRUE(fast->ok()) << fast->status();
  EXPECT_EQ(durable_seq, 0u) << "nothing to wait for";
  absl::StatusOr<v1::HeartbeatResponse> queued = coord_->Heartbeat(req);
  ASSERT_TRUE(queued.ok()) << queued.status();
  ASSERT_EQ((*fast)->assignments_size(), 1);
  EXPECT_EQ((*fast)->assignments(0).DebugString(),
            queued->assignments(0).DebugString());
  EXPECT_EQ((*fast)->heartbeat_interval_ms(), queued->heartbeat_interval_ms());
  EXPECT_EQ((*fast)->incarnation(), queued->incarnation());
  ASSERT_EQ((*fast)->orders_size(), queued->orders_size());
  for (int i = 0; i < queued->orders_size(); ++i)
    EXPECT_EQ((*fast)->orders(i).id(), queued->orders(i).id());
  // Its acknowledgements count as the queued one's do.
  std::vector<uint64_t> acks;
  for (const v1::Order& o : (*fast)->orders()) acks.push_back(o.id());
  ASSERT_FALSE(acks.empty());
  *req.mutable_acked_order_ids() = {acks.begin(), acks.end()};
  fast = coord_->TryHeartbeat(req, &durable_seq);
  ASSERT_TRUE(fast.has_value());
  ASSERT_TRUE(fast->ok()) << fast->status();
  req.clear_acked_order_ids();
  queued = coord_->Heartbeat(req);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(queued->orders_size(), 0) << "acknowledged orders sent again";
  // Bad input is refused there as in the queue, naming the field.
  v1::HeartbeatRequest bad = req;
  bad.set_node_id("");
  fast = coord_->TryHeartbeat(bad, &durable_seq);
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fast->status().message().find("node_id"), std::string::npos)
      << fast->status();
}

// A heartbeat whose own call finds its node dead (its timeout passed
// unseen) is refused only once that death is durable, as the queued
// Heartbeat's refusal is; run on gRPC's thread, which must not wait for a
// durable write, TryHeartbeat hands the wait back (durable_seq) for a
// worker to do before answering.
TEST_F(CoordinatorTest, TryHeartbeatHandsBackTheDurableWaitOfARefusal) {
  const uint64_t e1 = Register("n1", 2);
  now_ms_ += heartbeat_timeout_ms_ + 1;
  v1::HeartbeatRequest req;
  req.set_node_id("n1");
  req.set_epoch(e1);
  uint64_t durable_seq = 0;
  std::optional<absl::StatusOr<v1::HeartbeatResponse>> r =
      coord_->TryHeartbeat(req, &durable_seq);
  ASSERT_TRUE(r.has_value()) << "the state lock was free";
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition)
      << r->status();
  EXPECT_NE(durable_seq, 0u)
      << "a refusal built on a death not yet durable must wait for it";
  EXPECT_TRUE(coord_->WaitDurable(durable_seq).ok());
  EXPECT_EQ(Node("n1").health(), v1::DEAD);
  // Fenced again, nothing new to wait for.
  r = coord_->TryHeartbeat(req, &durable_seq);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(durable_seq, 0u);
}

// KindQueue::TryRunHere (the heartbeat served on gRPC's thread): counted
// against the kind's bound while it runs, as an admitted call is; with the
// bound full (or 0: an operator shedding the kind) nothing runs and no
// refusal is counted, the caller going through TryRun.
TEST(KindQueueTest, TryRunHereCountsAgainstTheBound) {
  KindQueue q("test", 1, 1, 100);
  bool ran = false, inner_admitted = true;
  EXPECT_TRUE(q.TryRunHere([&] {
    ran = true;
    inner_admitted = q.TryRun([] {});  // the bound (1) is this call's
    return true;
  }));
  EXPECT_TRUE(ran);
  EXPECT_FALSE(inner_admitted) << "the call run here did not count";
  EXPECT_EQ(q.refused(), 1u);
  q.SetCapacity(0);
  ran = false;
  EXPECT_FALSE(q.TryRunHere([&] {
    ran = true;
    return true;
  }));
  EXPECT_FALSE(ran);
  EXPECT_EQ(q.refused(), 1u);
  q.SetCapacity(1);
  EXPECT_FALSE(q.TryRunHere([] { return false; }));  // it did not answer
  std::atomic<bool> queued_ran{false};
  ASSERT_TRUE(q.TryRun([&] { queued_ran = true; })) << "its slot was kept";
  q.Stop();  // runs what was admitted
  EXPECT_TRUE(queued_ran);
}

}  // namespace
}  // namespace ckpt::coordinator
