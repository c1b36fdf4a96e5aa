// ReplicaTargets alone: the placement is computed once until it is stale,
// and only a refusal of a node's current target moves that node's target.
#include "coordinator/replica_targets.h"

#include <gtest/gtest.h>

namespace ckpt::coordinator {
namespace {

PlacementNode Node(const std::string& id, const std::string& domain) {
  PlacementNode p;
  p.id = id;
  p.domain = domain;
  p.source = true;
  p.holder = true;
  return p;
}

class ReplicaTargetsTest : public ::testing::Test {
 protected:
  std::vector<PlacementNode> Candidates() {
    ++computed_;
    return nodes_;
  }
  const std::map<std::string, std::string>& Current() {
    return targets_.Current([this] { return Candidates(); }, epoch_of_,
                            now_ms_);
  }
  bool Refused(const std::string& source, const std::string& holder) {
    return targets_.Refused(
        source, holder, [this] { return Candidates(); }, epoch_of_, now_ms_);
  }

  // Three nodes in two domains: "a" has a holder in another domain ("c")
  // and one in its own ("b").
  std::vector<PlacementNode> nodes_ = {Node("a", "d1"), Node("b", "d1"),
                                       Node("c", "d2")};
  ReplicaRefusals::EpochOf epoch_of_ = [](const std::string&) {
    return uint64_t{1};  // every node alive in its first epoch
  };
  ReplicaTargets targets_;
  int computed_ = 0;
  int64_t now_ms_ = 1'000;
};

TEST_F(ReplicaTargetsTest, PlacementIsComputedOnceUntilStale) {
  const std::map<std::string, std::string> first = Current();
  EXPECT_EQ(first, PlaceReplicas(nodes_));
  EXPECT_EQ(first.at("a"), "c") << "another failure domain first";
  Current();
  EXPECT_EQ(computed_, 1);
  nodes_.pop_back();  // "c" goes: only a stale placement sees it
  EXPECT_EQ(Current(), first);
  targets_.MarkStale();
  EXPECT_EQ(Current().at("a"), "b");
  EXPECT_EQ(computed_, 2);
}

TEST_F(ReplicaTargetsTest, ARefusalOfTheCurrentTargetMovesIt) {
  ASSERT_EQ(Current().at("a"), "c");
  EXPECT_FALSE(Refused("a", "b")) << "b is not a's target: a stale refusal";
  EXPECT_EQ(Current().at("a"), "c");
  EXPECT_TRUE(Refused("a", "c"));
  EXPECT_EQ(Current().at("a"), "b") << "c excluded for a";
  EXPECT_FALSE(Refused("a", "c")) << "c is no longer a's target";
  EXPECT_EQ(Current().at("a"), "b");
}

TEST_F(ReplicaTargetsTest, ARefusalEndsWithTheHoldersEpoch) {
  ASSERT_TRUE(Refused("a", "c"));
  ASSERT_EQ(Current().at("a"), "b");
  epoch_of_ = [](const std::string& id) {
    return uint64_t{id == "c" ? 2u : 1u};  // c restarted: its memory is empty
  };
  targets_.MarkStale();
  EXPECT_EQ(Current().at("a"), "c");
}

TEST_F(ReplicaTargetsTest, AtScaleAStalePlacementIsComputedAtMostEvery200Ms) {
  // A registration storm marks the placement stale once per registration
  // and every heartbeat asks for it: computed at once each time, a storm
  // of N nodes cost O(N^2 log N).
  nodes_.clear();
  for (int i = 0; i < 100; ++i)
    nodes_.push_back(Node("n" + std::to_string(i), i % 2 ? "d1" : "d2"));
  ASSERT_EQ(Current().size(), 100u);
  ASSERT_EQ(computed_, 1);
  for (int i = 0; i < 50; ++i) {  // registrations between heartbeats
    targets_.MarkStale();
    Current();
  }
  EXPECT_EQ(computed_, 1) << "within 200 ms of the last computation";
  now_ms_ += ReplicaTargets::kMinAgeMs;
  Current();
  EXPECT_EQ(computed_, 2) << "stale and old enough";
  Current();
  EXPECT_EQ(computed_, 2) << "not stale";
  // A refusal moves its target at once, whatever the placement's age.
  const std::string target = Current().at("n0");
  ASSERT_TRUE(Refused("n0", target));
  EXPECT_NE(Current().at("n0"), target);
  EXPECT_EQ(computed_, 3);
  // A clock that went back is no reason to keep a stale placement.
  targets_.MarkStale();
  now_ms_ -= 10'000;
  Current();
  EXPECT_EQ(computed_, 4);
}

TEST_F(ReplicaTargetsTest, ASmallClusterIsComputedAgainAtOnce) {
  for (int i = 0; i < 3; ++i) {
    targets_.MarkStale();
    Current();
  }
  EXPECT_EQ(computed_, 3) << "3 candidates: exact, whatever the clock";
}

}  // namespace
}  // namespace ckpt::coordinator
