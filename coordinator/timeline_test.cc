// Timelines and bounds of the Coordinator, with the fake clock: reports of
// an abandoned generation, what MANIFEST.global records
// (10), soft state that never commits (22), and a plan nobody acknowledges
// (23).
#include <prometheus/text_serializer.h>

#include "coordinator/coordinator_testing.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

class TimelineTest : public TwoNodeTest {
 protected:
  // One report through the node's batch call, with a generation when set.
  absl::Status ReportGen(const std::string& node, uint64_t epoch, uint64_t step,
                         uint32_t rank, v1::ShardState state,
                         std::optional<uint64_t> generation, uint64_t digest,
                         std::optional<uint64_t> trainer_age_ms = {}) {
    v1::ReportShardsRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    v1::ShardReport* r = req.add_reports();
    r->set_job("job");
    r->set_step(step);
    r->set_rank(rank);
    r->set_state(state);
    r->set_bytes(1000 + rank);
    r->set_checksum_digest(digest);
    if (generation) r->set_generation(*generation);
    if (trainer_age_ms) r->set_trainer_age_ms(*trainer_age_ms);
    if (state == v1::DURABLE)
      r->set_key("job/step-" + std::to_string(step) + "/rank-" +
                 std::to_string(rank));
    auto resp = coord_->ReportShards(req);
    if (!resp.ok()) return resp.status();
    const v1::ReportResult& res = resp->results(0);
    return absl::Status(static_cast<absl::StatusCode>(res.code()),
                        res.message());
  }
  absl::Status ReportAllGen(uint64_t step, v1::ShardState state,
                            std::optional<uint64_t> gen, uint64_t digest_base) {
    for (uint32_t r = 0; r < 4; ++r) {
      absl::Status s = ReportGen(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, step,
                                 r, state, gen, digest_base + r);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // A trainer of rank 3 dies: a plan (generation + 1).
  void TrainerDies() {
    auto r = coord_->ReportTrainerExit(TrainerExit("n2", e2_, 3, 9));
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->failure());
  }
  std::string MetricsText() {
    return prometheus::TextSerializer().Serialize(
        coord_->options().metrics->Collect());
  }
};

// A plan drops step 15 (staged on three ranks only); the old
// timeline's reports of 15 that arrive afterwards (trainers saving while
// being stopped, persists finishing) must not make it good, and must not
// stand in the way of the new timeline's own step 15.
TEST_F(TimelineTest,
       ReportsOfAnAbandonedGenerationAreDroppedAndRecreateNothing) {
  ASSERT_TRUE(ReportAllGen(10, v1::STAGED, 0, 0xa0).ok());
  ASSERT_TRUE(ReportAllGen(10, v1::DURABLE, 0, 0xa0).ok());
  for (uint32_t r = 0; r < 3; ++r)
    ASSERT_TRUE(ReportGen(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, 15, r,
                          v1::STAGED, 0, 0xb0 + r)
                    .ok());
  TrainerDies();
  ASSERT_EQ(Job().generation(), 1u);
  ASSERT_EQ(Job().restore_step(), 10u);  // 15 was not on every rank: dropped

  // The old timeline's reports of 15, replayed at unchanged epochs.
  absl::Status staged = ReportAllGen(15, v1::STAGED, 0, 0xb0);
  EXPECT_EQ(staged.code(), absl::StatusCode::kFailedPrecondition) << staged;
  EXPECT_NE(staged.message().find("generation"), absl::string_view::npos)
      << staged;
  absl::Status durable = ReportAllGen(15, v1::DURABLE, 0, 0xb0);
  EXPECT_EQ(durable.code(), absl::StatusCode::kFailedPrecondition) << durable;
  EXPECT_EQ(Job().last_good_step(), 10u)
      << "an abandoned timeline's step became good";

  // The new timeline's step 15, other bytes: accepted and committed.
  absl::Status fresh = ReportAllGen(15, v1::STAGED, 1, 0xc0);
  ASSERT_TRUE(fresh.ok()) << fresh;
  ASSERT_TRUE(ReportAllGen(15, v1::DURABLE, 1, 0xc0).ok());
  EXPECT_EQ(Job().last_good_step(), 15u);
  auto m = ReadManifest(15);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->shards(0).checksum_digest(), storage::DigestHex(0xc0));
  EXPECT_EQ(m->generation(), 1u);  // MANIFEST.global records its timeline
}

// A persist that failed for good on n2 (rank 3 of step 12,
// staged on every rank) makes its node retract the save. A later plan
// must not choose step 12, whose rank 3 is restorable nowhere, but the
// newest step that is (10, durable). A retraction of another save (other
// digest) or of nothing known changes nothing.
TEST_F(TimelineTest, SaveThatFailedForGoodIsRetractedAndNoPlanChoosesItsStep) {
  ASSERT_TRUE(ReportAllGen(10, v1::STAGED, std::nullopt, 0xa0).ok());
  ASSERT_TRUE(ReportAllGen(10, v1::DURABLE, std::nullopt, 0xa0).ok());
  ASSERT_TRUE(ReportAllGen(12, v1::STAGED, std::nullopt, 0xb0).ok());
  auto retract = [&](uint64_t step, uint32_t rank, uint64_t digest) {
    v1::ReportShardsRequest req;
    req.set_node_id("n2");
    req.set_epoch(e2_);
    v1::ShardReport* r = req.add_reports();
    r->set_job("job");
    r->set_step(step);
    r->set_rank(rank);
    r->set_state(v1::STAGED);
    r->set_bytes(1000 + rank);
    r->set_checksum_digest(digest);
    r->set_failed(true);
    auto resp = coord_->ReportShards(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->results(0).code(), 0) << resp->results(0).message();
  };
  retract(12, 3, 0xdead);  // not this save: nothing changes
  retract(13, 3, 0xb3);    // no such step: nothing changes
  retract(12, 3, 0xb3);    // the save of rank 3 of step 12
  int failed_events = 0;
  const v1::EventsResponse events = coord_->Events({});
  for (const v1::Event& e : events.events())
    if (e.kind() == v1::SHARD_FAILED) {
      ++failed_events;
      EXPECT_NE(e.detail().find("step 12 rank 3"), std::string::npos)
          << e.detail();
    }
  EXPECT_EQ(failed_events, 1);
  TrainerDies();
  EXPECT_EQ(Job().restore_step(), 10u)
      << "a plan chose a step whose rank 3 failed for good";
}

// Reports without a generation (a daemon that does not send it, a trainer
// not started by ckptrun) are judged as before: by epoch and step only.
TEST_F(TimelineTest, ReportsWithoutAGenerationAreJudgedAsBefore) {
  TrainerDies();
  ASSERT_EQ(Job().generation(), 1u);
  ASSERT_TRUE(ReportAllGen(20, v1::STAGED, std::nullopt, 0xd0).ok());
  ASSERT_TRUE(ReportAllGen(20, v1::DURABLE, std::nullopt, 0xd0).ok());
  EXPECT_EQ(Job().last_good_step(), 20u);
  // A newer generation than the coordinator's is not refused either.
  ASSERT_TRUE(ReportAllGen(21, v1::STAGED, 7, 0xe0).ok());
}

// A trainer launched without ckptrun carries no generation; its node
// sends how long ago it started. One that started before the failure the
// current generation answers still saves for the abandoned timeline and
// is refused, naming its generation; one that started after it (its
// launcher restarted it) counts, and so does one whose start is unknown.
TEST_F(TimelineTest, TrainersWithoutAGenerationAreJudgedByWhenTheyStarted) {
  TrainerDies();  // now: the failure generation 1 answers
  ASSERT_EQ(Job().generation(), 1u);
  now_ms_ += 500;
  // Started 5 s before the failure.
  absl::Status zombie =
      ReportGen("n1", e1_, 20, 0, v1::STAGED, std::nullopt, 0xd0, 5'500);
  EXPECT_EQ(zombie.code(), absl::StatusCode::kFailedPrecondition) << zombie;
  EXPECT_NE(zombie.message().find("trainer_age_ms"), absl::string_view::npos)
      << zombie;
  EXPECT_NE(zombie.message().find("runs in generation 0"),
            absl::string_view::npos)
      << zombie;
  // Restarted 0.4 s after the failure: every rank's save of 20 counts.
  for (v1::ShardState state : {v1::STAGED, v1::DURABLE})
    for (uint32_t r = 0; r < 4; ++r) {
      absl::Status s = ReportGen(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, 20, r,
                                 state, std::nullopt, 0xe0 + r, 100);
      ASSERT_TRUE(s.ok()) << s;
    }
  EXPECT_EQ(Job().last_good_step(), 20u);
  // No start known (another pid namespace): judged as before.
  EXPECT_TRUE(ReportGen("n1", e1_, 21, 0, v1::STAGED, std::nullopt, 0xf0).ok());
  // A bound on the age, so that no arithmetic on it overflows.
  absl::Status huge = ReportGen("n1", e1_, 21, 1, v1::STAGED, std::nullopt,
                                0xf1, uint64_t{1} << 60);
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  EXPECT_NE(huge.message().find("trainer_age_ms"), absl::string_view::npos)
      << huge;
}

// With one rank never durable (a full disk on one node), no
// step commits and last good never moves; the per-rank records of every
// step must not pile up without bound. The oldest are trimmed (counted in
// a metric); the newest still commit once they complete.
TEST_F(TimelineTest, RecordsOfStepsThatNeverCommitAreBounded) {
  ASSERT_TRUE(ReportAllGen(1, v1::STAGED, 0, 0x10).ok());
  ASSERT_TRUE(ReportAllGen(1, v1::DURABLE, 0, 0x10).ok());
  for (uint64_t step = 2; step < 500; ++step) {
    ASSERT_TRUE(ReportAllGen(step, v1::STAGED, 0, 0x10).ok()) << step;
    for (uint32_t r = 0; r < 3; ++r)  // rank 3's persist never succeeds
      ASSERT_TRUE(ReportGen(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, step, r,
                            v1::DURABLE, 0, 0x10 + r)
                      .ok());
  }
  EXPECT_EQ(Job().last_good_step(), 1u);
  const std::string text = MetricsText();
  EXPECT_GE(ckpt::testing::SampleValue(
                text, "ckpt_coordinator_soft_steps_trimmed_total")
                .value_or(0),
            400.0)
      << text;
  // An old step's records are gone: its last DURABLE report is refused.
  EXPECT_FALSE(ReportGen("n2", e2_, 2, 3, v1::DURABLE, 0, 0x13).ok());
  // The newest step is whole once rank 3 is durable.
  ASSERT_TRUE(ReportGen("n2", e2_, 499, 3, v1::DURABLE, 0, 0x13).ok());
  EXPECT_EQ(Job().last_good_step(), 499u);
}

// A PREFETCH blocked forever (a read on a hung NFS) while the
// node's heartbeats go on must not keep the plan PLAN_ORDERED forever:
// past the acknowledgement deadline the silent node fails for that plan
// (an event names it and the order) and a new plan moves its ranks.
TEST_F(TimelineTest, PlanNotAcknowledgedInTimeFailsTheSilentNodeAndPlansAgain) {
  ASSERT_TRUE(ReportAllGen(10, v1::STAGED, 0, 0xa0).ok());
  ASSERT_TRUE(ReportAllGen(10, v1::DURABLE, 0, 0xa0).ok());
  Reopen();  // no records in memory: every host must PREFETCH step 10
  TrainerDies();
  ASSERT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  // n1 and the spare acknowledge what they get; n2 heartbeats and never
  // acknowledges (its prefetch hangs).
  auto beat = [&](const std::string& node, uint64_t epoch) {
    auto hb = Heartbeat(node, epoch);
    ASSERT_TRUE(hb.ok()) << hb.status();
    std::vector<uint64_t> ids;
    for (const auto& o : hb->orders()) ids.push_back(o.id());
    if (!ids.empty()) {
      ASSERT_TRUE(Heartbeat(node, epoch, ids).ok());
    }
    if (hb->run_health_check() != 0) {
      // As ckptd does (a spare's report is stale after half an hour): run
      // the checks asked for and report them.
      v1::HeartbeatRequest checked;
      checked.set_node_id(node);
      checked.set_epoch(epoch);
      checked.mutable_health_report();
      checked.set_health_check_id(hb->run_health_check());
      ASSERT_TRUE(coord_->Heartbeat(checked).ok());
    }
  };
  for (int i = 0; i < 30 * 60 && Job().generation() == 1u; ++i) {
    now_ms_ += 1000;
    beat("n1", e1_);
    beat("s1", es_);
    auto n2 = Heartbeat("n2", e2_);
    if (Job().generation() == 1u) {
      ASSERT_TRUE(n2.ok()) << n2.status();
    }
  }
  // The spare, idle for half an hour, is checked before it takes ranks.
  beat("s1", es_);
  // Generation 2 waited for the stale spare's check, 3 placed on it.
  EXPECT_EQ(Job().generation(), 3u) << "the plan stayed unacknowledged";
  EXPECT_EQ(EventsOf(v1::PLAN_WAITING).size(), 1u);
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  EXPECT_NE(Node("n2").dead_reason().find("acknowledge"), std::string::npos)
      << Node("n2").dead_reason();
  EXPECT_EQ(Job().rank_node(3), "s1");  // its ranks moved to the spare
  bool named = false;
  const v1::EventsResponse events = coord_->Events({});
  for (const auto& e : events.events())
    named |= e.kind() == v1::FAILURE_DETECTED &&
             e.detail().find("PREFETCH") != std::string::npos;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace ckpt::coordinator
