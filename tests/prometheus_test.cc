// A real Prometheus (Debian's `prometheus`) started by the test on a free
// loopback port scrapes a real ckptd and a real ckpt-coordinator every
// second while a client saves; the test asks Prometheus's HTTP API and finds
// one save-stall observation per save. The config also loads
// packaging/alerts.yml, so Prometheus itself accepts the rules. Label slow.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "tests/harness.h"
#include "tests/metrics_scrape.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

// A child process with stdout and stderr in `log`; SIGTERM, then SIGKILL,
// on destruction.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool alive() const { return pid_ > 0 && kill(pid_, 0) == 0; }

 private:
  pid_t pid_ = -1;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '_' || c == '.' || c == '-') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// The value of an instant query's first result, or nullopt (no result yet).
std::optional<double> Query(int port, const std::string& promql) {
  auto body = HttpGet("http://127.0.0.1:" + std::to_string(port) +
                      "/api/v1/query?query=" + UrlEncode(promql));
  if (!body || body->find("\"status\":\"success\"") == std::string::npos)
    return std::nullopt;
  size_t v = body->find("\"value\":[");
  if (v == std::string::npos) return std::nullopt;
  size_t q = body->find('"', body->find(',', v));
  size_t e = body->find('"', q + 1);
  if (q == std::string::npos || e == std::string::npos) return std::nullopt;
  return std::stod(body->substr(q + 1, e - q - 1));
}

TEST(PrometheusTest, RealPrometheusSeesOneSaveStallObservationPerSave) {
  if (RunCommand("prometheus --version", true, 30).exit_code != 0)
    GTEST_SKIP() << "prometheus not installed";
  TempDir dir, run;
  const std::string prefix = UniqueShmPrefix();
  const int ckptd_port = FreeLoopbackPort(), coord_port = FreeLoopbackPort(),
            prom_port = FreeLoopbackPort();
  auto daemon = DaemonProcess::Start(
      dir.path() + "/root", run.path(), prefix,
      {"--metrics-listen", "127.0.0.1:" + std::to_string(ckptd_port)});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Child coordinator(
      {COORDINATOR_BINARY, "--insecure", "--listen", "127.0.0.1:0", "--state",
       dir.path() + "/coord", "--metrics-listen",
       "127.0.0.1:" + std::to_string(coord_port)},
      dir.path() + "/coordinator.log");

  std::ofstream(dir.path() + "/alerts.yml")
      << Slurp(std::string(CKPT_SOURCE_DIR) + "/packaging/alerts.yml");
  std::ofstream(dir.path() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files: [alerts.yml]\n"
      << "scrape_configs:\n"
      << "  - job_name: ckptd\n    static_configs: [{targets: ['127.0.0.1:"
      << ckptd_port << "']}]\n"
      << "  - job_name: ckpt-coordinator\n    static_configs: [{targets: "
         "['127.0.0.1:"
      << coord_port << "']}]\n";
  Child prometheus(
      {"prometheus", "--config.file=" + dir.path() + "/prometheus.yml",
       "--storage.tsdb.path=" + dir.path() + "/tsdb",
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
       "--log.level=warn"},
      dir.path() + "/prometheus.log");

  constexpr int kSaves = 5;
  auto client = Client::Connect(OptionsFor(**daemon, "prom", 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  HostState s = MakeState(1 << 20, 4, 1);
  for (int step = 1; step <= kSaves; ++step)
    ASSERT_TRUE((*client)->Save(step, s.tensors).ok());
  ASSERT_TRUE((*client)->WaitDurable(kSaves).ok());

  // Prometheus starts, then scrapes each target once a second.
  const std::string stall = "ckptd_save_stall_seconds_count{ckpt_job=\"prom\"}";
  std::optional<double> saves, coordinator_up;
  for (int i = 0; i < 100; ++i) {
    saves = Query(prom_port, stall);
    coordinator_up = Query(prom_port, "up{job=\"ckpt-coordinator\"}");
    if (saves == kSaves && coordinator_up == 1.0) break;
    ASSERT_TRUE(prometheus.alive()) << Slurp(dir.path() + "/prometheus.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(saves, kSaves) << Slurp(dir.path() + "/prometheus.log");
  EXPECT_EQ(coordinator_up, 1.0) << Slurp(dir.path() + "/coordinator.log");
  EXPECT_EQ(Query(prom_port,
                  "ckpt_coordinator_nodes{state=\"alive\",role=\"worker\"}"),
            0.0);
  EXPECT_EQ(Query(prom_port, "ckptd_persisted_shards_total{tier=\"local\"}"),
            kSaves);
  // The rules loaded and evaluate (none fires on a healthy daemon).
  EXPECT_EQ(
      Query(prom_port, "count(ALERTS{alertstate=\"firing\"}) or vector(0)"),
      0.0);
  daemon->reset();
  UnlinkArenas(prefix);
}

}  // namespace
}  // namespace ckpt::testing
