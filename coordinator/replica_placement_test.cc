// PlaceReplicas (replica_placement.h): failure domains, balance, the
// degenerate clusters, and determinism.
#include "coordinator/replica_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace ckpt::coordinator {
namespace {

PlacementNode N(const std::string& id, const std::string& domain,
                bool source = true, bool holder = true) {
  return PlacementNode{id, domain, source, holder};
}

std::map<std::string, int> Loads(const std::map<std::string, std::string>& t) {
  std::map<std::string, int> load;
  for (const auto& [src, holder] : t) ++load[holder];
  return load;
}

TEST(ReplicaPlacementTest, EveryTargetIsInAnotherDomainAndHoldersAreSpread) {
  std::vector<PlacementNode> nodes;
  for (const char* rack : {"rack-a", "rack-b", "rack-c"})
    for (int i = 0; i < 3; ++i)
      nodes.push_back(N(std::string(rack) + "-n" + std::to_string(i), rack));
  auto t = PlaceReplicas(nodes);
  ASSERT_EQ(t.size(), 9u);
  std::map<std::string, std::string> domain;
  for (const auto& n : nodes) domain[n.id] = n.domain;
  for (const auto& [src, holder] : t) {
    EXPECT_NE(src, holder);
    EXPECT_NE(domain[src], domain[holder]) << src << " -> " << holder;
  }
  for (const auto& [holder, load] : Loads(t)) EXPECT_EQ(load, 1) << holder;
}

TEST(ReplicaPlacementTest, TwoNodesThatCanPairOtherwiseAreNotMutual) {
  // Two domains of two: a pair that replicates to each other loses both
  // copies when both die; with four nodes no pair needs to.
  auto t =
      PlaceReplicas({N("a1", "a"), N("a2", "a"), N("b1", "b"), N("b2", "b")});
  ASSERT_EQ(t.size(), 4u);
  int mutual = 0;
  for (const auto& [src, holder] : t) mutual += t.at(holder) == src;
  EXPECT_EQ(mutual, 0);
  for (const auto& [holder, load] : Loads(t)) EXPECT_EQ(load, 1) << holder;
}

TEST(ReplicaPlacementTest, OneDomainFallsBackToAnyOtherNode) {
  auto t = PlaceReplicas({N("n1", "rack"), N("n2", "rack"), N("n3", "rack")});
  ASSERT_EQ(t.size(), 3u);
  for (const auto& [src, holder] : t) EXPECT_NE(src, holder);
  for (const auto& [holder, load] : Loads(t)) EXPECT_EQ(load, 1) << holder;
}

TEST(ReplicaPlacementTest, EmptyDomainsAreEachTheirOwn) {
  EXPECT_FALSE(SameDomain("", ""));
  auto t = PlaceReplicas({N("n1", ""), N("n2", "")});
  EXPECT_EQ(t.at("n1"), "n2");
  EXPECT_EQ(t.at("n2"), "n1");
}

TEST(ReplicaPlacementTest, ASingleNodeOrNoHolderGetsNoTarget) {
  EXPECT_TRUE(PlaceReplicas({N("n1", "a")}).empty());
  EXPECT_TRUE(
      PlaceReplicas({N("n1", "a", true, false), N("n2", "b", true, false)})
          .empty());
}

TEST(ReplicaPlacementTest, OnlyHoldersHoldAndSparesMay) {
  // n2 runs no replica listener; s1 (a spare: no source) may hold.
  auto t = PlaceReplicas(
      {N("n1", "a"), N("n2", "b", true, false), N("s1", "c", false, true)});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_NE(t.at("n1"), "n2");
  EXPECT_NE(t.at("n2"), "n2");
  EXPECT_FALSE(t.count("s1"));
}

TEST(ReplicaPlacementTest, TheSameMembershipInAnyOrderGivesTheSameTargets) {
  std::vector<PlacementNode> nodes = {N("n1", "a"), N("n2", "b"), N("n3", "a"),
                                      N("n4", "c"), N("s1", "b", false)};
  auto first = PlaceReplicas(nodes);
  std::reverse(nodes.begin(), nodes.end());
  EXPECT_EQ(PlaceReplicas(nodes), first);
  std::rotate(nodes.begin(), nodes.begin() + 2, nodes.end());
  EXPECT_EQ(PlaceReplicas(nodes), first);
}

TEST(ReplicaPlacementTest, HostOfDropsOnlyAPort) {
  EXPECT_EQ(HostOf("node-1:7070"), "node-1");
  EXPECT_EQ(HostOf("node-1"), "node-1");
  EXPECT_EQ(HostOf("::1"), "::1");
}

}  // namespace
}  // namespace ckpt::coordinator
