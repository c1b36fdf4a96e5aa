// One failure, one plan (fake clock): a trainer whose collective broke
// because a peer's node died says so in its exit report; the coordinator
// probes the suspected node at once and plans once, for the node, instead
// of planning the survivor's exit and then the node's heartbeat timeout.
// A node that answers the probe keeps its ranks.
#include <algorithm>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class PeerProbeTest : public TwoNodeTest {
 protected:
  // Rank `rank` on n1 exited with code 1; `peers` set: it said it lost
  // them (an empty list: it does not know which).
  absl::StatusOr<v1::ReportTrainerExitResponse> Exit(
      uint32_t rank, std::optional<std::vector<uint32_t>> peers) {
    v1::ReportTrainerExitRequest req = TrainerExit("n1", e1_, rank, 0, 1);
    req.set_generation(Job().generation());
    if (peers) {
      req.set_peer_lost(true);
      for (uint32_t p : *peers) req.add_lost_peer_ranks(p);
    }
    return coord_->ReportTrainerExit(req);
  }
  // Every node but n2 heartbeats, `ms` later.
  void OthersHeartbeat(int64_t ms) {
    now_ms_ += ms;
    ASSERT_TRUE(Heartbeat("n1", e1_).ok());
    ASSERT_TRUE(Heartbeat("s1", es_).ok());
  }
  size_t Plans() { return EventsOf(v1::PLAN_MADE).size(); }
  // Rank 0 on n1 exits having lost `peers` (empty: unnamed); n2, probed,
  // answers 50 ms later, which plans once.
  void LosePeersOnN2AndHearItAnswer(const std::vector<uint32_t>& peers) {
    OthersHeartbeat(100);
    ASSERT_TRUE(Heartbeat("n2", e2_).ok());
    const uint64_t gen = Job().generation();
    auto r = Exit(0, peers);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->held());
    now_ms_ += 50;
    ASSERT_TRUE(Heartbeat("n2", e2_).ok());  // the answer
    ASSERT_EQ(Job().generation(), gen + 1);
  }
  // FAILURE_DETECTED events about node `node`.
  std::vector<v1::Event> FailuresOf(const std::string& node) {
    std::vector<v1::Event> out;
    for (const v1::Event& e : EventsOf(v1::FAILURE_DETECTED))
      if (e.node_id() == node) out.push_back(e);
    return out;
  }
};

// The timeline: n2 dies; rank 0 on n1 fails its collective and
// exits, then rank 1 (its local peer) exits without knowing why. Both
// exits wait for the probe of n2, which does not answer: one plan.
TEST_F(PeerProbeTest, SurvivorsExitsAreFoldedIntoOnePlanForTheSilentNode) {
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  auto r = Exit(0, std::vector<uint32_t>{2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->held());
  EXPECT_EQ(Job().generation(), 0u) << "the survivor's exit was planned";
  EXPECT_NE(coord_->NodeOrders("n2").probe(), 0u) << "n2 is not probed";
  EXPECT_EQ(coord_->NodeOrders("n1").probe(), 0u);
  ASSERT_EQ(EventsOf(v1::PEER_SUSPECTED).size(), 1u);
  EXPECT_NE(EventsOf(v1::PEER_SUSPECTED)[0].detail().find("n2"),
            std::string::npos);

  auto second = Exit(1, std::nullopt);  // no evidence, during the probe
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->held());
  OthersHeartbeat(200);
  EXPECT_EQ(Job().generation(), 0u);
  EXPECT_EQ(Node("n2").health(), v1::ALIVE) << "dead before its deadline";

  OthersHeartbeat(101);  // past the 300 ms deadline
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  ASSERT_EQ(FailuresOf("n2").size(), 1u);
  EXPECT_NE(FailuresOf("n2")[0].detail().find("probe"), std::string::npos)
      << FailuresOf("n2")[0].detail();
  EXPECT_TRUE(FailuresOf("n1").empty()) << FailuresOf("n1")[0].detail();
  EXPECT_EQ(Job().generation(), 1u);
  ASSERT_EQ(Plans(), 1u);
  const std::string plan = EventsOf(v1::PLAN_MADE)[0].detail();
  EXPECT_NE(plan.find("n2"), std::string::npos) << plan;
  EXPECT_NE(plan.find("rank 0"), std::string::npos) << plan;
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().rank_node(0), "n1");
  EXPECT_EQ(coord_->NodeOrders("n2").probe(), 0u);

  // n2's heartbeat timeout passes: it is dead already, nothing more.
  for (int i = 0; i < 4; ++i) OthersHeartbeat(1000);
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Plans(), 1u);
}

// A slow but alive node answers the probe: it keeps its ranks and its
// epoch; the exit that suspected it is a failure of its own (its rank must
// start again), planned once.
TEST_F(PeerProbeTest, ProbedNodeThatAnswersKeepsItsRanks) {
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  auto r = Exit(0, std::vector<uint32_t>{2, 3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->held());
  EXPECT_EQ(Job().generation(), 0u) << "planned before the probe's answer";
  now_ms_ += 50;
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());  // the answer
  ASSERT_EQ(EventsOf(v1::PROBE_ANSWERED).size(), 1u);
  EXPECT_EQ(EventsOf(v1::PROBE_ANSWERED)[0].node_id(), "n2");
  EXPECT_EQ(Job().generation(), 1u) << "the exit was never planned";
  EXPECT_EQ(Plans(), 1u);
  EXPECT_EQ(FailuresOf("n1").size(), 1u);
  EXPECT_TRUE(FailuresOf("n2").empty());
  EXPECT_EQ(Node("n2").health(), v1::ALIVE);
  EXPECT_EQ(Node("n2").epoch(), e2_);
  EXPECT_EQ(Job().rank_node(2), "n2");
  EXPECT_EQ(Job().rank_node(3), "n2");
  EXPECT_EQ(coord_->NodeOrders("n2").probe(), 0u);

  // Its deadline passes: the answer stands.
  now_ms_ += 400;
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  OthersHeartbeat(0);
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::ALIVE);
  EXPECT_EQ(Plans(), 1u);
}

// The heartbeat timeout finds the node while its probe is under way: the
// timeout's plan covers the exit that waited; the probe's deadline then
// changes nothing.
TEST_F(PeerProbeTest, HeartbeatTimeoutDuringTheProbeMakesTheOnePlan) {
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  for (int i = 0; i < 29; ++i) OthersHeartbeat(100);  // n2 silent 2.9 s
  auto r = Exit(0, std::vector<uint32_t>{3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Job().generation(), 0u) << "the survivor's exit was planned";
  OthersHeartbeat(150);  // n2's 3 s timeout
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  EXPECT_EQ(Job().generation(), 1u);
  OthersHeartbeat(400);  // the probe's deadline
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Plans(), 1u);
  EXPECT_EQ(FailuresOf("n2").size(), 1u);
}

// Ranks lost by their peers on a node that answers the probe: the node's
// daemon lives, but its trainers are gone or too slow for the collective.
// The incident is the answering node's, not the survivor's (whose exit
// only says a peer went away): repeated, the answering node is cordoned
// and its ranks go to the spare. Before, the survivor's node was charged,
// and two such losses cordoned the healthy n1 (a cluster test's race,
// CI of stop 52: b's launcher reported first).
TEST_F(PeerProbeTest, RanksLostOnANodeThatAnswersChargeThatNodeNotTheSurvivor) {
  cordon_.after = 2;
  Reopen();
  for (int round = 0; round < 2; ++round)
    ASSERT_NO_FATAL_FAILURE(LosePeersOnN2AndHearItAnswer({2}));
  EXPECT_FALSE(Node("n1").cordoned()) << Node("n1").cordon_reason();
  ASSERT_TRUE(Node("n2").cordoned());
  EXPECT_NE(Node("n2").cordon_reason().find("rank 0"), std::string::npos)
      << Node("n2").cordon_reason();
  EXPECT_EQ(Job().rank_node(0), "n1");
  EXPECT_EQ(Job().rank_node(2), "s1");
  EXPECT_EQ(Job().rank_node(3), "s1");
  EXPECT_EQ(Plans(), 2u) << "the cordon's plan is the second round's";
}

// Peers unnamed (the trainer knows only that its collective broke): every
// other node of the job is probed, and when all answer nobody is charged,
// neither the survivor nor a node picked at random.
TEST_F(PeerProbeTest, UnnamedPeersLostChargeNoNode) {
  cordon_.after = 2;
  Reopen();
  for (int round = 0; round < 3; ++round)
    ASSERT_NO_FATAL_FAILURE(LosePeersOnN2AndHearItAnswer({}));
  EXPECT_FALSE(Node("n1").cordoned()) << Node("n1").cordon_reason();
  EXPECT_FALSE(Node("n2").cordoned()) << Node("n2").cordon_reason();
  EXPECT_EQ(Plans(), 3u);
}

// A node whose connection to the coordinator is open (its agent's
// WatchNode stream: its process lives) and that misses the probe's
// deadline is slow, not dead: on a loaded machine a live ckptd can take
// longer than 300 ms to answer. It keeps its ranks until it answers (the
// exit is then a failure of its own) or its heartbeat times out; the
// overdue probe is an event. A node whose connection is gone (its process
// was killed: the kernel closed its socket) is dead at the deadline, as
// before, and one whose connection closes after the deadline is dead then.
TEST_F(PeerProbeTest, ConnectedNodeLateToAnswerIsNotDeadForIt) {
  coord_->NodeWatchOpened("n2");
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  auto r = Exit(0, std::vector<uint32_t>{2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->held());
  OthersHeartbeat(301);  // past the 300 ms deadline, n2 silent
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::ALIVE)
      << (FailuresOf("n2").empty() ? "" : FailuresOf("n2")[0].detail());
  EXPECT_EQ(Job().generation(), 0u);
  ASSERT_EQ(EventsOf(v1::PROBE_OVERDUE).size(), 1u);
  EXPECT_EQ(EventsOf(v1::PROBE_OVERDUE)[0].node_id(), "n2");
  EXPECT_NE(EventsOf(v1::PROBE_OVERDUE)[0].detail().find("connection"),
            std::string::npos)
      << EventsOf(v1::PROBE_OVERDUE)[0].detail();
  OthersHeartbeat(200);
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(EventsOf(v1::PROBE_OVERDUE).size(), 1u) << "said twice";
  EXPECT_NE(coord_->NodeOrders("n2").probe(), 0u) << "the probe was dropped";

  ASSERT_TRUE(Heartbeat("n2", e2_).ok());  // the late answer
  ASSERT_EQ(EventsOf(v1::PROBE_ANSWERED).size(), 1u);
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Plans(), 1u);
  EXPECT_TRUE(FailuresOf("n2").empty());
  EXPECT_EQ(Node("n2").epoch(), e2_);
  EXPECT_EQ(Job().rank_node(2), "n2");

  // Probed again; this time its connection closes after the deadline.
  auto again = Exit(1, std::vector<uint32_t>{3});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->held());
  OthersHeartbeat(301);
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::ALIVE);
  coord_->NodeWatchEnded("n2");
  OthersHeartbeat(1);
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  ASSERT_EQ(FailuresOf("n2").size(), 1u);
  EXPECT_NE(FailuresOf("n2")[0].detail().find("connection"), std::string::npos)
      << FailuresOf("n2")[0].detail();
  EXPECT_EQ(Job().generation(), 2u);
  EXPECT_EQ(Plans(), 2u);
}

// A connected node silent past its heartbeat timeout is dead, probe or
// not: an open connection is no heartbeat.
TEST_F(PeerProbeTest, ConnectedButSilentNodeStillTimesOut) {
  coord_->NodeWatchOpened("n2");
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  auto r = Exit(0, std::vector<uint32_t>{2});
  ASSERT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 31; ++i) {
    OthersHeartbeat(100);
    ASSERT_TRUE(coord_->Tick().ok());
  }
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Plans(), 1u);
  ASSERT_EQ(FailuresOf("n2").size(), 1u);
  EXPECT_NE(FailuresOf("n2")[0].detail().find("no heartbeat"),
            std::string::npos)
      << FailuresOf("n2")[0].detail();
}

// An exit without evidence while no probe is under way is a crash of its
// own: planned at once, as before.
TEST_F(PeerProbeTest, ExitWithoutEvidenceIsPlannedAtOnce) {
  auto r = Exit(0, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->held());
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_TRUE(EventsOf(v1::PEER_SUSPECTED).empty());
  // Peers on the reporting node itself: its launcher reports them; nothing
  // to probe either.
  auto local = Exit(1, std::vector<uint32_t>{0});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->held());
  EXPECT_EQ(Job().generation(), 2u);
}

// A trainer kept in its process (in-process restart) reports its lost
// peers while it runs: held and probed like a peer-lost exit, then planned
// as a failure, never taken for a finish (its exit code is 0).
TEST_F(PeerProbeTest, RunningTrainersLostPeersAreHeldAndPlannedAsAFailure) {
  OthersHeartbeat(100);
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());
  v1::ReportTrainerExitRequest req = TrainerExit("n1", e1_, 0, 0, 0);
  req.set_generation(Job().generation());
  req.set_peer_lost(true);
  req.add_lost_peer_ranks(2);
  req.set_process_kept(true);
  auto r = coord_->ReportTrainerExit(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->failure());
  EXPECT_TRUE(r->held());
  EXPECT_TRUE(EventsOf(v1::TRAINER_FINISHED).empty());
  EXPECT_EQ(Job().generation(), 0u) << "planned before the probe's answer";
  EXPECT_NE(coord_->NodeOrders("n2").probe(), 0u) << "n2 is not probed";
  now_ms_ += 50;
  ASSERT_TRUE(Heartbeat("n2", e2_).ok());  // the answer
  EXPECT_EQ(Job().generation(), 1u);
  EXPECT_EQ(Plans(), 1u);
  ASSERT_EQ(FailuresOf("n1").size(), 1u);
  EXPECT_NE(FailuresOf("n1")[0].detail().find("its process is kept"),
            std::string::npos)
      << FailuresOf("n1")[0].detail();
}

TEST_F(PeerProbeTest, ProcessKeptWithoutPeerLostOrWithAnExitIsRefused) {
  std::vector<v1::ReportTrainerExitRequest> bad;
  bad.push_back(TrainerExit("n1", e1_, 0, 0, 0));  // no peer_lost
  bad.push_back(TrainerExit("n1", e1_, 0, 0, 1));  // it exited
  bad.push_back(TrainerExit("n1", e1_, 0, 9, 0));  // it was killed
  for (size_t i = 0; i < bad.size(); ++i) {
    bad[i].set_process_kept(true);
    if (i > 0) bad[i].set_peer_lost(true);
    auto r = coord_->ReportTrainerExit(bad[i]);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_NE(r.status().message().find("process_kept"), std::string::npos)
        << r.status();
  }
  EXPECT_EQ(Job().generation(), 0u);
  EXPECT_TRUE(EventsOf(v1::TRAINER_FINISHED).empty());
  EXPECT_TRUE(EventsOf(v1::FAILURE_DETECTED).empty());
  EXPECT_TRUE(EventsOf(v1::PEER_SUSPECTED).empty());
}

}  // namespace
}  // namespace ckpt::coordinator
