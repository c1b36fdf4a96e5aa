// PlaceReplicas (replica_placement.h): failure domains, balance, the
// degenerate clusters, and determinism.
#include "coordinator/replica_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace ckpt::coordinator {
namespace {

PlacementNode N(const std::string& id, const std::string& domain,
                bool source = true, bool holder = true) {
  return PlacementNode{id, domain, source, holder, {}};
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

// The rule of replica_placement.h written out plainly: for each source in
// ring order, the allowed holder with the least (load, replicates to the
// source, ring distance).
std::map<std::string, std::string> PlainRule(std::vector<PlacementNode> nodes) {
  std::sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) {
    return std::tie(a.domain, a.id) < std::tie(b.domain, b.id);
  });
  const size_t n = nodes.size();
  std::vector<uint32_t> load(n, 0);
  std::vector<size_t> target(n, SIZE_MAX);
  std::map<std::string, std::string> out;
  for (size_t s = 0; s < n; ++s) {
    if (!nodes[s].source) continue;
    auto may = [&](size_t h) {
      return nodes[h].holder && h != s && !nodes[s].excluded.count(nodes[h].id);
    };
    bool other = false;
    for (size_t h = 0; h < n; ++h)
      other |= may(h) && !SameDomain(nodes[h].domain, nodes[s].domain);
    size_t best = SIZE_MAX;
    std::tuple<uint32_t, bool, size_t> best_key;
    for (size_t h = 0; h < n; ++h) {
      if (!may(h) || (other && SameDomain(nodes[h].domain, nodes[s].domain)))
        continue;
      std::tuple<uint32_t, bool, size_t> key{load[h], target[h] == s,
                                             (h + n - s) % n};
      if (best == SIZE_MAX || key < best_key) best = h, best_key = key;
    }
    if (best == SIZE_MAX) continue;
    target[s] = best;
    ++load[best];
    out[nodes[s].id] = nodes[best].id;
  }
  return out;
}

TEST(ReplicaPlacementTest, TheFastPlacementFollowsThePlainRule) {
  std::mt19937 rng(19);
  for (int round = 0; round < 300; ++round) {
    std::vector<PlacementNode> nodes;
    const int count = 1 + static_cast<int>(rng() % 40);
    const int domains = static_cast<int>(rng() % 6);  // 0: all unlabelled
    for (int i = 0; i < count; ++i) {
      const int d = domains == 0 ? -1 : static_cast<int>(rng() % (domains + 1));
      nodes.push_back(N("n" + std::to_string(i),
                        d <= 0 ? "" : "rack-" + std::to_string(d),
                        rng() % 4 != 0, rng() % 3 != 0));
    }
    // Some sources had copies refused by some holders.
    for (auto& node : nodes)
      while (rng() % 3 == 0)
        node.excluded.insert("n" + std::to_string(rng() % count));
    ASSERT_EQ(PlaceReplicas(nodes), PlainRule(nodes)) << "round " << round;
  }
}

TEST(ReplicaPlacementTest, AHolderThatRefusedIsSkippedUnderTheSameRules) {
  // n1's nearest holder in another domain is n2; n2 refused n1's copies.
  std::vector<PlacementNode> nodes = {N("n1", "a"), N("n2", "b"), N("n3", "a"),
                                      N("n4", "c", false)};
  ASSERT_EQ(PlaceReplicas(nodes).at("n1"), "n2");
  nodes[0].excluded = {"n2"};
  auto t = PlaceReplicas(nodes);
  EXPECT_EQ(t.at("n1"), "n4") << "another domain, not n3 in n1's own";
  // Only n1 is affected: n2 and n3 still get targets.
  EXPECT_EQ(t.size(), 3u);
  // With every other domain's holder refused, n1's own domain is next.
  nodes[0].excluded = {"n2", "n4"};
  EXPECT_EQ(PlaceReplicas(nodes).at("n1"), "n3");
  // Every holder refused: no target at all.
  nodes[0].excluded = {"n2", "n3", "n4"};
  EXPECT_FALSE(PlaceReplicas(nodes).count("n1"));
}

TEST(ReplicaPlacementTest, HostOfDropsOnlyAPort) {
  EXPECT_EQ(HostOf("node-1:7070"), "node-1");
  EXPECT_EQ(HostOf("node-1"), "node-1");
  EXPECT_EQ(HostOf("::1"), "::1");
}

}  // namespace
}  // namespace ckpt::coordinator
