// The heartbeat interval the coordinator tells its nodes
// (heartbeat_interval.h): it grows with the cluster and never past a third
// of the timeout, every RegisterNode and Heartbeat reply says it, a real
// node agent heartbeats at what it was told, and refuses a value that
// would let it be declared dead between two heartbeats.
#include "coordinator/heartbeat_interval.h"

#include <gtest/gtest.h>

#include <chrono>

#include "coordinator/coordinator_testing.h"
#include "coordinator/server_testing.h"

namespace ckpt::coordinator {
namespace {

using std::chrono::milliseconds;

TEST(HeartbeatIntervalTest, RuleGrowsWithNodesAndKeepsThreeInTheTimeout) {
  EXPECT_EQ(HeartbeatIntervalMs(3000, 1, 2048), 600);
  EXPECT_EQ(HeartbeatIntervalMs(3000, 2048, 2048), 600);
  EXPECT_EQ(HeartbeatIntervalMs(3000, 3072, 2048), 900);
  EXPECT_EQ(HeartbeatIntervalMs(3000, 16384, 2048), 1000);  // capped
  EXPECT_EQ(HeartbeatIntervalMs(3000, 16384, 0), 600);      // rule off
  EXPECT_EQ(HeartbeatIntervalMs(50, 1 << 20, 1), 20);       // the floor
  for (uint64_t n : {1ull, 100ull, 5000ull, 1ull << 40})
    EXPECT_LE(3 * HeartbeatIntervalMs(3000, n, 2048), 3000) << n;
}

v1::RegisterNodeResponse RegisterOrDie(Coordinator* c, const std::string& id,
                                       uint32_t net_probe_port = 0) {
  v1::RegisterNodeRequest req;
  req.set_node_id(id);
  req.set_address(id + ":1");
  req.set_capacity(2);
  req.set_net_probe_port(net_probe_port);
  auto r = c->RegisterNode(req);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : v1::RegisterNodeResponse();
}

// With 2 nodes per base interval and a 3 s timeout: 600 ms up to 2 nodes,
// 900 at 3, then capped at 1000 (a third of the timeout); registrations
// and heartbeats alike say it.
TEST_F(CoordinatorTest, EveryReplyTellsTheIntervalOfTheClusterSize) {
  heartbeat_interval_nodes_ = 2;
  Reopen();
  const v1::RegisterNodeResponse n1 = RegisterOrDie(coord_.get(), "n1");
  EXPECT_EQ(n1.heartbeat_interval_ms(), 600u);
  EXPECT_EQ(RegisterOrDie(coord_.get(), "n2").heartbeat_interval_ms(), 600u);
  EXPECT_EQ(RegisterOrDie(coord_.get(), "n3").heartbeat_interval_ms(), 900u);
  auto hb = Heartbeat("n1", n1.epoch());
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->heartbeat_interval_ms(), 900u) << "n1 learns the new size";
  EXPECT_EQ(RegisterOrDie(coord_.get(), "n4").heartbeat_interval_ms(), 1000u);
  hb = Heartbeat("n1", n1.epoch());
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_EQ(hb->heartbeat_interval_ms(), 1000u);
  EXPECT_LE(3 * hb->heartbeat_interval_ms(), heartbeat_timeout_ms_)
      << "three missed heartbeats fit in the timeout";
}

// The network check gathers its nodes only when one registers or dies,
// not on every heartbeat: a node registered after a round began is still
// in the next round (its heartbeat gets its probe order).
TEST_F(CoordinatorTest, NetworkCheckStillSeesANodeRegisteredLater) {
  const uint64_t e1 = RegisterOrDie(coord_.get(), "n1", 7001).epoch();
  const uint64_t e2 = RegisterOrDie(coord_.get(), "n2", 7002).epoch();
  ASSERT_TRUE(Heartbeat("n1", e1).ok());
  ASSERT_TRUE(Heartbeat("n2", e2).ok());
  const uint64_t e3 = RegisterOrDie(coord_.get(), "n3", 7003).epoch();
  auto hb = Heartbeat("n3", e3);
  ASSERT_TRUE(hb.ok()) << hb.status();
  ASSERT_EQ(hb->net_probes_size(), 1) << "n3 is in no round";
  EXPECT_EQ(hb->net_probes(0).peer_node(), "n2");  // n2 -> n3 in the ring
}

// A real agent takes the interval its coordinator tells, at registration
// and when a later heartbeat says the cluster grew.
TEST_F(ServerTest, AgentHeartbeatsAtTheIntervalItIsTold) {
  heartbeat_timeout_ms_ = 3000;
  heartbeat_interval_nodes_ = 1;
  Start();
  auto agent = Agent();
  ASSERT_TRUE(Eventually([&] { return agent->epoch() > 0; }));
  EXPECT_EQ(agent->heartbeat_interval(), milliseconds(600));
  RegisterOrDie(server_->coordinator(), "n2");  // 2 nodes: 1200, capped
  EXPECT_TRUE(Eventually([&] {
    return agent->heartbeat_interval() == milliseconds(1000);
  })) << "interval "
      << agent->heartbeat_interval().count() << " ms";
}

TEST(TakeHeartbeatIntervalTest, RefusesWhatWouldOutlastTheTimeout) {
  auto older = daemon::TakeHeartbeatInterval(0, 3000);  // an older coordinator
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(*older, milliseconds(600));
  auto told = daemon::TakeHeartbeatInterval(1000, 3000);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_EQ(*told, milliseconds(1000));
  for (uint32_t bad : {1001u, 5u}) {
    auto r = daemon::TakeHeartbeatInterval(bad, 3000);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("heartbeat_interval_ms"),
              std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace ckpt::coordinator
