// The network check's plan (net_check.h): a ring of probes over the
// probing nodes, a sender told to go only once its receiver expects the
// token, each node judged on the best of its probes, a new round when the
// nodes change, and late probes counted as failed.
#include "coordinator/net_check.h"

#include <gtest/gtest.h>

namespace ckpt::coordinator {
namespace {

std::map<std::string, NetEndpoint> Nodes(std::vector<std::string> ids) {
  std::map<std::string, NetEndpoint> out;
  uint32_t port = 7000;
  for (const auto& id : ids) out[id] = {"10.0.0." + id, port++};
  return out;
}

v1::NetProbeResult Result(const std::string& token, double mb_per_s,
                          const std::string& error = "") {
  v1::NetProbeResult r;
  r.set_token(token);
  r.set_mb_per_s(mb_per_s);
  r.set_error(error);
  return r;
}

// Runs one heartbeat of every node until each sender was told to go;
// returns sender -> its send order.
std::map<std::string, v1::NetProbeOrder> SendOrders(
    NetCheckPlanner& p, const std::vector<std::string>& ids) {
  std::map<std::string, v1::NetProbeOrder> sends;
  for (int beat = 0; beat < 3; ++beat)
    for (const auto& id : ids)
      for (const auto& o : p.OrdersFor(id, 0))
        if (o.send()) sends[id] = o;
  return sends;
}

TEST(NetCheckTest, ThreeNodesFormARingAndASenderWaitsForItsReceiver) {
  NetCheckPlanner p;
  p.SetNodes(Nodes({"1", "2", "3"}), 0);
  // Node 1 sends to 2, but 2 has not been told the token yet.
  for (const auto& o : p.OrdersFor("1", 0)) EXPECT_FALSE(o.send());
  auto to_2 = p.OrdersFor("2", 0);  // told to expect 1's probe
  ASSERT_EQ(to_2.size(), 1u);
  EXPECT_FALSE(to_2[0].send());
  EXPECT_EQ(to_2[0].peer_node(), "1");
  for (const auto& o : p.OrdersFor("1", 0)) EXPECT_FALSE(o.send());
  p.OrdersFor("2", 0);  // 2 heartbeat again: it expects the token now
  std::vector<v1::NetProbeOrder> go;
  for (const auto& o : p.OrdersFor("1", 0))
    if (o.send()) go.push_back(o);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_EQ(go[0].peer_node(), "2");
  EXPECT_EQ(go[0].peer_host(), "10.0.0.2");
  EXPECT_EQ(go[0].peer_port(), 7001u);
  EXPECT_EQ(go[0].token(), to_2[0].token());
  EXPECT_EQ(go[0].token().size(), 32u);
  EXPECT_EQ(go[0].bytes(), 64u << 20);

  auto sends = SendOrders(p, {"1", "2", "3"});
  ASSERT_EQ(sends.size(), 3u);
  EXPECT_EQ(sends["2"].peer_node(), "3");
  EXPECT_EQ(sends["3"].peer_node(), "1");
  // Node 3's links are slow: it is the one left with a low figure, in
  // the round and in the second sample a low figure gets.
  for (int sample = 0; sample < 2; ++sample) {
    if (sample == 1) sends = SendOrders(p, {"1", "2", "3"});
    ASSERT_EQ(sends.size(), 3u);
    EXPECT_FALSE(p.Record("1", Result(sends["1"].token(), 1000), 0));
    EXPECT_FALSE(p.Record("2", Result(sends["2"].token(), 5), 0));
    EXPECT_TRUE(p.figures().empty());  // the round is not finished
    EXPECT_EQ(p.Record("3", Result(sends["3"].token(), 6), 0), sample == 1);
  }
  ASSERT_EQ(p.figures().size(), 3u);
  EXPECT_EQ(p.figures().at("1").mb_per_s, 1000);
  EXPECT_EQ(p.figures().at("2").mb_per_s, 1000);
  EXPECT_EQ(p.figures().at("3").mb_per_s, 6);
  EXPECT_TRUE(p.OrdersFor("1", 0).empty());  // nothing left to do
}

TEST(NetCheckTest, AHeartbeatRecordsItsResultsAndCarriesItsOrders) {
  NetCheckPlanner p;
  const auto nodes = Nodes({"1", "2"});
  bool finished = false;
  auto beat = [&](const std::string& id,
                  const std::vector<v1::NetProbeResult>& results) {
    v1::HeartbeatRequest req;
    req.set_node_id(id);
    for (const auto& r : results) *req.add_net_results() = r;
    v1::HeartbeatResponse resp;
    finished = p.Heartbeat(nodes, req, 0, &resp);
    return resp;
  };
  std::string token;
  for (int i = 0; i < 3 && token.empty(); ++i) {
    beat("2", {});
    const v1::HeartbeatResponse to_1 = beat("1", {});
    for (const auto& o : to_1.net_probes())
      if (o.send()) token = o.token();
  }
  ASSERT_FALSE(token.empty()) << "node 1 was never told to send";
  EXPECT_FALSE(finished);
  EXPECT_TRUE(beat("1", {Result(token, 900)}).net_probes().empty());
  EXPECT_TRUE(finished);
  ASSERT_EQ(p.figures().size(), 2u);
  EXPECT_EQ(p.figures().at("1").mb_per_s, 900);
}

TEST(NetCheckTest, ARoundsFigureReplacesTheReportsNetworkCheck) {
  v1::NodeHealthReport report;
  report.add_checks()->set_name("memcpy");
  PutNetworkCheck({.mb_per_s = 0, .errors = std::string(600, 'e')}, &report);
  PutNetworkCheck({.mb_per_s = 850, .errors = ""}, &report);
  ASSERT_EQ(report.checks_size(), 2);
  EXPECT_EQ(report.checks(0).name(), "memcpy");
  const v1::HealthCheck& net = report.checks(1);
  EXPECT_EQ(net.name(), "network");
  EXPECT_EQ(net.unit(), "MB/s");
  EXPECT_EQ(net.figure(), 850);
  EXPECT_TRUE(net.passed());
  EXPECT_TRUE(net.reason().empty());
  PutNetworkCheck({.mb_per_s = 0, .errors = std::string(600, 'e')}, &report);
  EXPECT_FALSE(report.checks(1).passed());
  EXPECT_EQ(report.checks(1).reason().size(), 512u);
}

TEST(NetCheckTest, AResultFromTheWrongNodeOrAnOldRoundIsIgnored) {
  NetCheckPlanner p;
  p.SetNodes(Nodes({"1", "2"}), 0);
  auto sends = SendOrders(p, {"1", "2"});
  ASSERT_EQ(sends.size(), 1u);  // two nodes: one probe
  const std::string token = sends["1"].token();
  EXPECT_FALSE(p.Record("2", Result(token, 900), 0));  // not its probe
  p.SetNodes(Nodes({"1", "2", "3"}), 0);               // a new round
  EXPECT_FALSE(p.Record("1", Result(token, 900), 0));  // an old token
  EXPECT_TRUE(p.figures().empty());
  EXPECT_EQ(p.round(), 2u);
}

TEST(NetCheckTest, AProbeWithoutAResultFailsAtItsDeadline) {
  NetCheckOptions o;
  o.order_ttl_ms = 1000;
  NetCheckPlanner p(o);
  p.SetNodes(Nodes({"1", "2"}), 0);
  auto sends = SendOrders(p, {"1", "2"});
  EXPECT_FALSE(p.ExpireLate(999));
  EXPECT_FALSE(p.ExpireLate(1000));  // sampled again
  sends = SendOrders(p, {"1", "2"});
  EXPECT_FALSE(p.ExpireLate(1999));
  EXPECT_TRUE(p.ExpireLate(2000));
  ASSERT_EQ(p.figures().size(), 2u);
  EXPECT_EQ(p.figures().at("1").mb_per_s, 0);
  EXPECT_NE(p.figures().at("2").errors.find("probe 1 -> 2: no result within"),
            std::string::npos)
      << p.figures().at("2").errors;
  EXPECT_FALSE(p.ExpireLate(5000));  // once
}

TEST(NetCheckTest, ALowFigureIsSampledAgainAndTheBetterSampleCounts) {
  NetCheckPlanner p;
  p.SetNodes(Nodes({"1", "2", "3"}), 0);
  auto sends = SendOrders(p, {"1", "2", "3"});
  ASSERT_EQ(sends.size(), 3u);
  // Node 2 met a busy CPU: its probes, sent and received, were slow.
  EXPECT_FALSE(p.Record("1", Result(sends["1"].token(), 4), 0));
  EXPECT_FALSE(p.Record("2", Result(sends["2"].token(), 5), 0));
  EXPECT_FALSE(p.Record("3", Result(sends["3"].token(), 900), 0));
  EXPECT_TRUE(p.figures().empty()) << "a low figure was published unconfirmed";
  EXPECT_EQ(p.round(), 1u);  // the same round, sampled again
  auto again = SendOrders(p, {"1", "2", "3"});
  ASSERT_EQ(again.size(), 3u);
  EXPECT_NE(again["1"].token(), sends["1"].token());
  EXPECT_FALSE(p.Record("1", Result(sends["1"].token(), 4), 0));  // old token
  EXPECT_FALSE(p.Record("1", Result(again["1"].token(), 950), 0));
  EXPECT_FALSE(p.Record("2", Result(again["2"].token(), 940), 0));
  EXPECT_TRUE(p.Record("3", Result(again["3"].token(), 700), 0));
  ASSERT_EQ(p.figures().size(), 3u);
  EXPECT_EQ(p.figures().at("1").mb_per_s, 950);
  EXPECT_EQ(p.figures().at("2").mb_per_s, 950);
  // Node 3: 900 in the first sample, max(940, 700) in the second.
  EXPECT_EQ(p.figures().at("3").mb_per_s, 940);
}

TEST(NetCheckTest, EveryFigureNearTheMedianIsPublishedAtOnce) {
  NetCheckPlanner p;
  p.SetNodes(Nodes({"1", "2", "3"}), 0);
  auto sends = SendOrders(p, {"1", "2", "3"});
  EXPECT_FALSE(p.Record("1", Result(sends["1"].token(), 800), 0));
  EXPECT_FALSE(p.Record("2", Result(sends["2"].token(), 900), 0));
  EXPECT_TRUE(p.Record("3", Result(sends["3"].token(), 700), 0));
  EXPECT_EQ(p.figures().size(), 3u);
}

TEST(NetCheckTest, OneNodeHasNothingToProbe) {
  NetCheckPlanner p;
  p.SetNodes(Nodes({"1"}), 0);
  EXPECT_TRUE(p.OrdersFor("1", 0).empty());
  EXPECT_FALSE(p.ExpireLate(1 << 30));
}

TEST(NetCheckTest, BadResultsAreRefusedNamingTheField) {
  v1::HeartbeatRequest req;
  *req.add_net_results() = Result(std::string(32, 'a'), 1);
  EXPECT_TRUE(ValidateNetResults(req).ok());
  req.mutable_net_results(0)->set_token("xyz");
  EXPECT_NE(ValidateNetResults(req).message().find("net_results[0].token"),
            std::string::npos);
  req.mutable_net_results(0)->set_token(std::string(32, 'a'));
  req.mutable_net_results(0)->set_mb_per_s(-1);
  EXPECT_NE(ValidateNetResults(req).message().find("net_results[0].mb_per_s"),
            std::string::npos);
  req.mutable_net_results(0)->set_mb_per_s(1);
  req.mutable_net_results(0)->set_error(std::string("\x01", 1));
  EXPECT_NE(ValidateNetResults(req).message().find("net_results[0].error"),
            std::string::npos);
  req.clear_net_results();
  for (int i = 0; i < 17; ++i)
    *req.add_net_results() = Result(std::string(32, 'a'), 1);
  EXPECT_NE(ValidateNetResults(req).message().find("net_results: 17"),
            std::string::npos);
}

}  // namespace
}  // namespace ckpt::coordinator
