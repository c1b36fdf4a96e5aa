// Node health checks (health.h) on real directories and the real /dev/shm.
#include "daemon/health/health.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "tests/private_mounts.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

const HealthCheckResult* Find(const std::vector<HealthCheckResult>& results,
                              const std::string& name) {
  for (const auto& r : results)
    if (r.name == name) return &r;
  return nullptr;
}

HealthOptions Options(const std::string& root) {
  HealthOptions o;
  o.root = root;
  o.memcpy_bytes = 1 << 20;
  return o;
}

TEST(HealthTest, HealthyNodePassesEveryCheckWithFigures) {
  testing::TempDir dir;
  auto o = Options(dir.path() + "/root");
  o.shared_root = dir.path() + "/shared";
  const auto results = RunHealthChecks(o);
  EXPECT_TRUE(AllPassed(results)) << HealthText(results);
  EXPECT_GT(Find(results, "memcpy")->figure, 0);
  EXPECT_GT(Find(results, "shm")->figure, 0);
  EXPECT_EQ(Find(results, "shared_root")->outcome,
            HealthCheckResult::Outcome::kPassed);
  // The probes leave nothing behind.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/root"));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/shared"));
  EXPECT_EQ(HealthJson(results).rfind("{\"healthy\":true,\"checks\":[", 0), 0u)
      << HealthJson(results);
}

// The shm check passes either way, and says so when arenas get no huge
// pages; two real tmpfs mounts in a private mount namespace (root only).
TEST(HealthTest, ShmCheckNamesAMountWithoutHugePages) {
  testing::TempDir dir;
  const std::string off = dir.path() + "/off", on = dir.path() + "/on";
  std::filesystem::create_directories(off);
  std::filesystem::create_directories(on);
  const testing::ChildResult r = testing::RunWithPrivateMounts(
      {{off, "size=16m"}, {on, "size=16m,huge=advise"}},
      [&]() -> std::pair<int, std::string> {
        std::string out;
        for (const std::string& d : {off, on}) {
          HealthOptions o = Options(dir.path() + "/root");
          o.shm_dir = d;
          const auto results = RunHealthChecks(o);
          const HealthCheckResult* shm = Find(results, "shm");
          out += std::string(shm->passed() ? "passed" : "FAILED") + " [" +
                 shm->reason + "]\n";
        }
        return {0, out};
      });
  if (r.skipped) GTEST_SKIP() << r.text;
  ASSERT_TRUE(r.exited && r.code == 0) << r.code << ": " << r.text;
  EXPECT_EQ(r.text, "passed [no huge pages (" + off +
                        " is mounted huge=never): each new mapping of an "
                        "arena fills a page table entry per 4 KiB "
                        "(doc/operations.md)]\npassed []\n");
}

TEST(HealthTest, RootThatIsNotADirectoryFailsTheRootCheckOnly) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  const auto results = RunHealthChecks(Options(dir.path() + "/file/root"));
  EXPECT_FALSE(AllPassed(results));
  const HealthCheckResult* root = Find(results, "root");
  EXPECT_EQ(root->outcome, HealthCheckResult::Outcome::kFailed);
  EXPECT_NE(root->reason.find("Not a directory"), std::string::npos)
      << root->reason;
  EXPECT_TRUE(Find(results, "memcpy")->passed());
  EXPECT_TRUE(Find(results, "shm")->passed());
}

TEST(HealthTest, ShmTooSmallForTheCapacityFailsNamingBothSizes) {
  testing::TempDir dir;
  auto o = Options(dir.path());
  o.shm_need_bytes = uint64_t{1} << 60;
  const auto results = RunHealthChecks(o);
  const HealthCheckResult* shm = Find(results, "shm");
  EXPECT_FALSE(shm->passed());
  EXPECT_NE(shm->reason.find("GiB free, the configured capacity needs"),
            std::string::npos)
      << shm->reason;
  EXPECT_NE(HealthText(results).find("shm: FAILED"), std::string::npos);
}

TEST(HealthTest, NoSharedRootIsSkippedNotFailed) {
  testing::TempDir dir;
  const auto results = RunHealthChecks(Options(dir.path()));
  EXPECT_EQ(Find(results, "shared_root")->outcome,
            HealthCheckResult::Outcome::kSkipped);
  EXPECT_TRUE(AllPassed(results)) << HealthText(results);
}

TEST(HealthTest, CheckThatHangsFailsAtItsDeadline) {
  // A shared root that never answers: the check's thread blocks until the
  // test releases it, long after the check has failed.
  auto release = std::make_shared<std::promise<void>>();
  std::shared_future<void> released = release->get_future().share();
  HealthCheckResult r = RunBounded(
      "shared_root",
      [released] {
        released.wait();
        return HealthCheckResult{
            "shared_root", HealthCheckResult::Outcome::kPassed, "", 0, "", 0};
      },
      std::chrono::milliseconds(100));
  release->set_value();
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.reason, "timed out after 0.1 s");
}

// A stalled S3 endpoint (it accepts connections and never answers): the
// shared-root check fails at its deadline instead of waiting on the
// object store's own retries.
TEST(HealthTest, StalledObjectStoreSharedRootFailsAtTheDeadline) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  setenv("AWS_ACCESS_KEY_ID", "health", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "health-secret", 1);
  testing::TempDir dir;
  auto o = Options(dir.path());
  o.shared_root = "s3://health-bucket/probe";
  o.object_config.endpoint =
      "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  o.object_config.addressing = "path";
  o.object_config.region = "us-east-1";
  o.timeout = std::chrono::milliseconds(1000);
  const auto results = RunHealthChecks(o);
  const HealthCheckResult* shared = Find(results, "shared_root");
  EXPECT_FALSE(shared->passed()) << HealthText(results);
  EXPECT_EQ(shared->reason, "timed out after 1.0 s") << shared->reason;
  EXPECT_TRUE(Find(results, "root")->passed());
  close(listener);  // the abandoned check's connection ends; it returns
}

TEST(HealthTest, ReportCarriesEveryCheck) {
  testing::TempDir dir;
  const auto report = ToHealthProto(RunHealthChecks(Options(dir.path())));
  ASSERT_EQ(report.checks_size(), 5);
  EXPECT_EQ(report.checks(0).name(), "memcpy");
  EXPECT_EQ(report.checks(0).unit(), "GB/s");
  EXPECT_EQ(report.checks(4).name(), "cuda");
}

}  // namespace
}  // namespace ckpt::daemon
