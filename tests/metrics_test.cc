// ckptd's and ckpt-coordinator's /metrics over real HTTP (doc/metrics.md):
// a real ckptd with --metrics-listen, a real client saving and restoring,
// the scraped values checked against what the client did; promtool accepts
// the text; bad --metrics-listen values are refused naming the flag; the
// dashboard and the alert rules name only families the binaries export.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "coordinator/client/channel.h"
#include "tests/daemon_test.h"
#include "tests/metrics_scrape.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using Labels = std::map<std::string, std::string>;

class MetricsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    daemon_.reset();
    UnlinkArenas(prefix_);
  }
  void StartDaemon(std::vector<std::string> extra = {}) {
    port_ = FreeLoopbackPort();
    extra.push_back("--metrics-listen");
    extra.push_back("127.0.0.1:" + std::to_string(port_));
    auto d = DaemonProcess::Start(root_.path() + "/root", run_.path(), prefix_,
                                  extra);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::string Scrape() {
    std::optional<std::string> body =
        HttpGet("http://127.0.0.1:" + std::to_string(port_) + "/metrics");
    EXPECT_TRUE(body.has_value()) << "GET /metrics failed";
    return body.value_or("");
  }
  // Scrapes until `done` holds for the text (the persister and the
  // manifest write run after the client's calls return).
  std::string ScrapeUntil(const std::function<bool(const std::string&)>& done) {
    std::string text;
    for (int i = 0; i < 200; ++i) {
      text = Scrape();
      if (done(text)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return text;
  }
  std::unique_ptr<Client> Connect(const std::string& job) {
    auto c = Client::Connect(OptionsFor(*daemon_, job, 0, 1));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir root_, run_;
  std::string prefix_ = UniqueShmPrefix();
  std::unique_ptr<DaemonProcess> daemon_;
  int port_ = 0;
};

TEST_F(MetricsTest, ScrapeCountsEverySaveRestoreAndPersistOfARealClient) {
  StartDaemon();
  auto client = Connect("mjob");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(1 << 20, 4, 1);
  for (int step = 1; step <= 3; ++step)
    ASSERT_TRUE(client->Save(step, s.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(3).ok());
  const Labels job{{"ckpt_job", "mjob"}}, local{{"tier", "local"}};
  std::string text = ScrapeUntil([&](const std::string& t) {
    return SampleValue(t, "ckptd_last_durable_step", job) == 3.0 &&
           SampleValue(t, "ckptd_persist_backlog_shards", local) == 0.0;
  });
  EXPECT_EQ(SampleValue(text, "ckptd_save_stall_seconds_count", job), 3.0);
  EXPECT_EQ(SampleValue(text, "ckptd_save_copy_seconds_count", job), 3.0);
  EXPECT_EQ(SampleValue(text, "ckptd_save_slot_wait_seconds_count", job), 3.0);
  EXPECT_GE(SampleValue(text, "ckptd_saved_bytes_total", job).value_or(0),
            3.0 * s.bytes());
  EXPECT_EQ(SampleValue(text, "ckptd_persisted_shards_total", local), 3.0);
  EXPECT_EQ(SampleValue(text, "ckptd_persist_seconds_count", local), 3.0);
  EXPECT_EQ(SampleValue(text, "ckptd_persisted_bytes_total", local),
            SampleValue(text, "ckptd_saved_bytes_total", job));
  EXPECT_EQ(SampleValue(text, "ckptd_last_durable_step", job), 3.0);
  EXPECT_EQ(SampleValue(text, "ckptd_persist_backlog_steps", local), 0.0);
  EXPECT_EQ(SampleValue(text, "ckptd_persist_backlog_bytes", local), 0.0);
  EXPECT_EQ(SampleValue(text, "ckptd_arenas", job), 1.0);
  EXPECT_GE(SampleValue(text, "ckptd_shm_bytes", job).value_or(0),
            2.0 * s.bytes());
  EXPECT_EQ(
      SampleValue(text, "ckptd_failures_total", {{"kind", "persist_write"}}),
      0.0);

  HostState got = s.EmptyLike();
  ASSERT_TRUE(client->Restore(3, got.tensors).ok());
  text = Scrape();
  EXPECT_EQ(SampleValue(text, "ckptd_restores_total", {{"source", "memory"}}),
            1.0);
  EXPECT_EQ(
      SampleValue(text, "ckptd_restore_seconds_count", {{"source", "memory"}}),
      1.0);
  EXPECT_EQ(SampleValue(text, "ckptd_restores_total", {{"source", "disk"}}),
            0.0);
}

TEST_F(MetricsTest, PromtoolAcceptsTheScrapedText) {
  if (RunCommand("promtool --version", true, 30).exit_code != 0)
    GTEST_SKIP() << "promtool not installed";
  // With an embedded coordinator: its families are checked too.
  StartDaemon({"--coordinator-listen",
               "127.0.0.1:" + std::to_string(FreeLoopbackPort())});
  auto client = Connect("promtool");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(256 << 10, 2, 1);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());
  std::string path = run_.path() + "/scrape.txt";
  const std::string text = Scrape();
  EXPECT_TRUE(SampleValue(text, "ckpt_coordinator_plans_total")) << text;
  std::ofstream(path) << text;
  CommandResult r = RunCommand("promtool check metrics < " + path, true, 30);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(MetricsTest, SeriesOfADeletedJobDisappear) {
  StartDaemon();
  auto client = Connect("gone");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(256 << 10, 2, 1);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());
  EXPECT_TRUE(SampleValue(Scrape(), "ckptd_save_stall_seconds_count",
                          {{"ckpt_job", "gone"}}));
  client.reset();
  grpc::ClientContext ctx;
  v1::DeleteRequest req;
  req.set_job("gone");
  req.set_all_steps(true);
  v1::DeleteResponse resp;
  ASSERT_TRUE(daemon_->Stub()->Delete(&ctx, req, &resp).ok());
  std::string text = ScrapeUntil([](const std::string& t) {
    return t.find("ckpt_job=\"gone\"") == std::string::npos;
  });
  EXPECT_EQ(text.find("ckpt_job=\"gone\""), std::string::npos) << text;
}

// The bad-input tests run the binaries directly: they must exit, non-zero,
// with a message naming the flag.
std::string Ckptd(const TempDir& dir, const std::string& args) {
  return std::string(CKPTD_BINARY) + " --socket " + dir.path() + "/s --root " +
         dir.path() + "/r " + args;
}
std::string Coordinator(const TempDir& dir, const std::string& args) {
  return std::string(COORDINATOR_BINARY) +
         " --insecure --listen 127.0.0.1:0 --state " + dir.path() + "/state " +
         args;
}

TEST(MetricsListenTest, MalformedValueIsRefusedNamingTheFlag) {
  TempDir dir;
  for (const char* bad : {"nonsense", "127.0.0.1:", "127.0.0.1:99999",
                          "host.example:9100", "[::1:9100", "127.0.0.1:x"}) {
    for (const std::string& cmd :
         {Ckptd(dir, std::string("--metrics-listen '") + bad + "'"),
          Coordinator(dir, std::string("--metrics-listen '") + bad + "'")}) {
      CommandResult r = RunCommand(cmd, true, 30);
      EXPECT_NE(r.exit_code, 0) << cmd;
      EXPECT_NE(r.out.find("--metrics-listen"), std::string::npos)
          << cmd << ": " << r.out;
    }
  }
}

TEST(MetricsListenTest, BadConfigValueIsRefusedNamingTheKey) {
  TempDir dir;
  std::ofstream(dir.path() + "/c.toml") << "metrics_listen = \"nonsense\"\n";
  for (const std::string& cmd :
       {Ckptd(dir, "--config " + dir.path() + "/c.toml"),
        Coordinator(dir, "--config " + dir.path() + "/c.toml")}) {
    CommandResult r = RunCommand(cmd, true, 30);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("metrics_listen"), std::string::npos)
        << cmd << ": " << r.out;
  }
}

TEST(MetricsListenTest, PortInUseIsRefusedNamingTheFlag) {
  TempDir dir;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string taken = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  for (const std::string& cmd :
       {Ckptd(dir, "--metrics-listen " + taken),
        Coordinator(dir, "--metrics-listen " + taken)}) {
    CommandResult r = RunCommand(cmd, true, 30);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("--metrics-listen"), std::string::npos)
        << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("in use"), std::string::npos) << cmd << ": " << r.out;
  }
  close(fd);
}

// One ckptd with an embedded coordinator serves both binaries' families on
// one endpoint; after a durable step every family has a series.
TEST_F(MetricsTest, DashboardAndAlertRulesNameOnlyExportedFamilies) {
  const std::string coordinator =
      "127.0.0.1:" + std::to_string(FreeLoopbackPort());
  StartDaemon({"--coordinator-listen", coordinator});
  // The job is the coordinator's once registered (ckptrun does this); the
  // node agent registers this node in the background first.
  auto stub = coordinator::NewCoordinatorStub(coordinator);
  grpc::Status registered;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    coord::v1::RegisterJobRequest req;
    req.set_job("dash");
    req.set_world_size(1);
    coord::v1::RegisterJobResponse resp;
    registered = stub->RegisterJob(&ctx, req, &resp);
    if (registered.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  auto client = Connect("dash");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(256 << 10, 2, 1);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());
  std::string text = ScrapeUntil([](const std::string& t) {
    return SampleValue(t, "ckpt_coordinator_last_good_step",
                       {{"ckpt_job", "dash"}}) == 1.0 &&
           SampleValue(t, "ckptd_last_durable_step", {{"ckpt_job", "dash"}}) ==
               1.0;
  });
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_last_good_step",
                        {{"ckpt_job", "dash"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_nodes",
                        {{"state", "alive"}, {"role", "worker"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_steps_committed_total"), 1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_commit_seconds_count"), 1.0);
  std::string families = run_.path() + "/families.txt";
  {
    std::ofstream out(families);
    for (const std::string& f : Families(text)) out << f << "\n";
  }
  CommandResult r = RunCommand(
      std::string("/usr/bin/python3 ") + CKPT_SOURCE_DIR +
          "/tests/check_dashboard.py --families " + families + " --dashboard " +
          CKPT_SOURCE_DIR + "/packaging/grafana/ckptd-dashboard.json --rules " +
          CKPT_SOURCE_DIR + "/packaging/alerts.yml",
      true, 30);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace ckpt::testing
