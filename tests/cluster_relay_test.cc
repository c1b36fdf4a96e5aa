// Relays (ckpt-relay, doc/operations.md "Relays") with real processes: a
// coordinator, a ckpt-relay and ckptd nodes started with
// --coordinator-relay. The nodes heartbeat and report through the relay and
// a step commits; the relay SIGKILLed, they go to the coordinator directly
// within a heartbeat interval and no node is declared dead; the relay
// restarted, they come back to it after their backoff. Every wait is on an
// event (metrics, log lines, the coordinator's job record), never a sleep.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/cluster_fixture.h"
#include "tests/cluster_harness.h"
#include "tests/metrics_scrape.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

class ClusterRelayTest : public ClusterTest {
 protected:
  void TearDown() override {
    if (HasFailure() && !relay_log_.empty())
      std::fprintf(stderr, "--- ckpt-relay:\n%s\n",
                   ReadFileToString(relay_log_).c_str());
    ClusterTest::TearDown();
  }
  // ckpt-relay on 127.0.0.1:port, to the cluster's coordinator; waits
  // until it listens.
  void StartRelay(int port, int metrics_port) {
    relay_log_ = dir_.path() + "/relay-" + std::to_string(++starts_) + ".log";
    relay_ = Proc::Spawn(
        {RELAY_BINARY, "--listen", "127.0.0.1:" + std::to_string(port),
         "--coordinator", cluster_->CoordinatorAddresses(), "--insecure",
         "--relay-id", "rack-1", "--metrics-listen",
         "127.0.0.1:" + std::to_string(metrics_port)},
        relay_log_);
    ASSERT_TRUE(Cluster::WaitUntil(
        [&] {
          return ReadFileToString(relay_log_).find("metrics listening on") !=
                 std::string::npos;
        },
        seconds(20)))
        << ReadFileToString(relay_log_);
  }
  // A sample of http://127.0.0.1:port/metrics, 0 when absent or
  // unreachable.
  static double Sample(int port, const std::string& name,
                       const std::map<std::string, std::string>& labels = {}) {
    std::optional<std::string> text =
        HttpGet("http://127.0.0.1:" + std::to_string(port) + "/metrics");
    if (!text) return 0;
    return SampleValue(*text, name, labels).value_or(0);
  }
  static double Heartbeats(int port, const char* via) {
    return Sample(port, "ckptd_coordinator_heartbeats_total", {{"via", via}});
  }
  size_t FailuresDetected() const {
    size_t n = 0;
    for (const cv1::Event& e : cluster_->Events())
      if (e.kind() == cv1::FAILURE_DETECTED) ++n;
    return n;
  }

  std::unique_ptr<Proc> relay_;
  std::string relay_log_;
  size_t starts_ = 0;
};

TEST_F(ClusterRelayTest,
       NodesGoThroughTheRelayDirectWhileItIsDeadAndBackAfter) {
  const std::vector<int> ports = FreeLoopbackPorts(5);
  const int relay_port = ports[0], relay_metrics = ports[1];
  const std::map<std::string, int> node_metrics = {{"a", ports[2]},
                                                   {"b", ports[3]}};
  ClusterOptions o = Options(4);
  o.last_step = 1000000;  // trains until the test ends
  o.ckptd_args = {"--coordinator-relay",
                  "127.0.0.1:" + std::to_string(relay_port)};
  for (const auto& [id, port] : node_metrics)
    o.node_ckptd_args[id] = {"--metrics-listen",
                             "127.0.0.1:" + std::to_string(port)};
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  ASSERT_NO_FATAL_FAILURE(StartRelay(relay_port, relay_metrics));
  cluster_->StartNode("a");
  cluster_->StartNode("b");

  // Registered, heartbeating and committing through the relay.
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(2));
  EXPECT_GT(
      Sample(relay_metrics, "ckpt_relay_items_total", {{"kind", "heartbeat"}}),
      0);
  EXPECT_GT(
      Sample(relay_metrics, "ckpt_relay_items_total", {{"kind", "report"}}), 0);
  EXPECT_GT(Sample(relay_metrics, "ckpt_relay_batches_total"), 0);
  for (const auto& [id, port] : node_metrics) {
    EXPECT_GT(Heartbeats(port, "relay"), 0) << id;
    EXPECT_EQ(Sample(port, "ckptd_relay_fallbacks_total"), 0) << id;
  }

  // The relay dies: each node's next heartbeat goes directly.
  relay_->Kill();
  const uint64_t good = LastGood();
  std::map<std::string, double> direct;
  for (const auto& [id, port] : node_metrics) {
    const double before = Heartbeats(port, "direct");
    ASSERT_TRUE(Cluster::WaitUntil(
        [p = port, before] { return Heartbeats(p, "direct") > before; },
        seconds(30)))
        << id << " never heartbeat directly";
    direct[id] = Heartbeats(port, "direct");
    EXPECT_GT(Sample(port, "ckptd_relay_fallbacks_total"), 0) << id;
  }
  // Two heartbeat timeouts pass, as counted by heartbeats the coordinator
  // answered directly (one an interval: timeout / 5): no node is dead.
  const double intervals = 2 * 5 + 2;
  for (const auto& [id, port] : node_metrics)
    ASSERT_TRUE(Cluster::WaitUntil(
        [p = port, d = direct[id], intervals] {
          return Heartbeats(p, "direct") >= d + intervals;
        },
        seconds(60)))
        << id;
  EXPECT_EQ(FailuresDetected(), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitForProgress(good + 1));
  for (const char* id : {"a", "b"}) {
    const std::string log = DaemonLog(id);
    EXPECT_NE(log.find("relay 127.0.0.1:" + std::to_string(relay_port)),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("directly, the relay is tried again in"),
              std::string::npos)
        << log;
  }

  // The relay is back: after their backoff the nodes use it again.
  ASSERT_NO_FATAL_FAILURE(StartRelay(relay_port, ports[4]));
  for (const auto& [id, port] : node_metrics) {
    const double relayed = Heartbeats(port, "relay");
    ASSERT_TRUE(Cluster::WaitUntil(
        [p = port, relayed] { return Heartbeats(p, "relay") > relayed; },
        seconds(60)))
        << id << " never came back to the relay";
    EXPECT_NE(DaemonLog(id).find("carries heartbeats and reports again"),
              std::string::npos);
  }
  EXPECT_EQ(FailuresDetected(), 0u);
}

// Bad flags stop ckpt-relay before it serves, naming the flag; ckptd's
// --coordinator-relay likewise.
TEST_F(ClusterRelayTest, BadFlagsAreRefusedNamingTheFlag) {
  struct Case {
    std::vector<std::string> argv;
    std::string names;
  };
  const std::string ok_coord = "127.0.0.1:1";
  const std::string root = dir_.path() + "/r";
  const std::vector<std::string> relay = {RELAY_BINARY,  "--listen",
                                          "127.0.0.1:0", "--coordinator",
                                          ok_coord,      "--insecure"};
  auto with = [](std::vector<std::string> base,
                 const std::vector<std::string>& more) {
    base.insert(base.end(), more.begin(), more.end());
    return base;
  };
  const std::vector<std::string> ckptd = {
      CKPTD_BINARY,    "--socket", dir_.path() + "/s.sock", "--root", root,
      "--shared-root", root};
  const Case cases[] = {
      {{RELAY_BINARY, "--coordinator", ok_coord, "--insecure"}, "--listen"},
      {{RELAY_BINARY, "--listen", "127.0.0.1:0", "--insecure"},
       "--coordinator"},
      {with(relay, {"--listen", "nohost"}), "--listen"},
      {with(relay, {"--coordinator", "h:99999"}), "--coordinator"},
      {{RELAY_BINARY, "--listen", "127.0.0.1:0", "--coordinator", ok_coord},
       "--insecure"},
      {with(relay, {"--tls-cert", "/nonexistent"}), "--tls"},
      {with(relay, {"--gather-ms", "5000"}), "--gather-ms"},
      {with(relay, {"--max-batch", "0"}), "--max-batch"},
      {with(relay, {"--max-batch", "x"}), "--max-batch"},
      {with(relay, {"--max-batch", "4097"}), "--max-batch"},
      {with(relay, {"--max-in-flight", "0"}), "--max-in-flight"},
      {with(relay, {"--relay-id", "a b"}), "--relay-id"},
      {with(relay, {"--relay-id", std::string(200, 'r')}), "--relay-id"},
      {with(relay, {"--metrics-listen", "nohost"}), "--metrics-listen"},
      {with(ckptd, {"--coordinator", ok_coord, "--coordinator-relay", "x"}),
       "--coordinator-relay"},
      {with(ckptd,
            {"--coordinator", ok_coord, "--coordinator-relay", "h:70000"}),
       "--coordinator-relay"},
      {with(ckptd, {"--coordinator-relay", "127.0.0.1:2"}),
       "--coordinator-relay: needs --coordinator"},
      {with(ckptd, {"--coordinator-listen", "127.0.0.1:0",
                    "--coordinator-relay", "127.0.0.1:2"}),
       "--coordinator-relay: not with --coordinator-listen"},
  };
  for (const Case& c : cases) {
    const std::string log = dir_.path() + "/bad.log";
    std::filesystem::remove(log);
    auto p = Proc::Spawn(c.argv, log);
    auto st = p->Wait(seconds(20));
    ASSERT_TRUE(st.has_value()) << c.names << ": kept running";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0) << c.names;
    const std::string text = ReadFileToString(log);
    EXPECT_NE(text.find(c.names), std::string::npos) << c.names << ": " << text;
  }
}

}  // namespace
}  // namespace ckpt::testing
