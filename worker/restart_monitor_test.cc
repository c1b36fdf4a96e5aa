// RestartMonitor against real files in a real $CKPT_RESTART_DIR: a plan
// the launcher writes there reaches the monitor by the directory's change
// notification, not by its next poll.
#include "worker/restart_monitor.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ckpt::worker {
namespace {

class RestartMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/restart-monitor-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(setenv("CKPT_RESTART_DIR", dir_.c_str(), 1), 0);
    log_ = std::tmpfile();
    ASSERT_NE(log_, nullptr);
  }
  void TearDown() override {
    unsetenv("CKPT_RESTART_DIR");
    if (log_ != nullptr) std::fclose(log_);
    std::filesystem::remove_all(dir_);
  }
  // As ckptrun writes it: beside, then renamed over `plan`.
  void WritePlan(uint64_t generation, uint32_t rank) {
    const std::string tmp = dir_ + "/plan.tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "generation=" << generation << "\nrank=" << rank
          << "\nworld_size=4\nlocal_rank=" << rank % 2
          << "\nlocal_world_size=2\nmaster_addr=127.0.0.1\nmaster_port=29500\n"
          << "restore_step=" << generation * 5 << "\n";
    }
    ASSERT_EQ(std::rename(tmp.c_str(), (dir_ + "/plan").c_str()), 0);
  }
  std::string Log() {
    std::fflush(log_);
    std::rewind(log_);
    std::string out;
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), log_)) > 0) out.append(buf, n);
    return out;
  }

  std::string dir_;
  std::FILE* log_ = nullptr;
};

// A poll period no test outlives: only the notification can bring the
// second plan. The first plan is there before the monitor starts, so its
// TakePlan shows the monitor read the directory once and is waiting.
TEST_F(RestartMonitorTest, APlanWrittenWakesTheMonitorNotItsPoll) {
  WritePlan(1, 2);
  RestartMonitor monitor(dir_, 0, std::chrono::hours(24), log_);
  RestartPlan first = monitor.TakePlan();
  EXPECT_EQ(first.generation, 1u);
  EXPECT_EQ(first.rank, 2u);
  EXPECT_FALSE(monitor.requested()->load());
  WritePlan(2, 3);
  RestartPlan second = monitor.TakePlan();  // before: blocked for 24 h
  EXPECT_EQ(second.generation, 2u);
  EXPECT_EQ(second.rank, 3u);
  ASSERT_TRUE(second.restore_step.has_value());
  EXPECT_EQ(*second.restore_step, 10);
  EXPECT_NE(Log().find("generation 2: restart requested"), std::string::npos)
      << Log();
}

// Files the trainer writes itself (`capable`, `joined`) and a plan of a
// generation already taken wake the monitor too; none is a new plan.
TEST_F(RestartMonitorTest, OtherFilesAndAnOldPlanRequestNothing) {
  WritePlan(3, 0);
  RestartMonitor monitor(dir_, 0, std::chrono::hours(24), log_);
  EXPECT_EQ(monitor.TakePlan().generation, 3u);
  std::ofstream(dir_ + "/joined") << "generation=3\n";
  WritePlan(3, 0);  // the same generation again: no restart
  WritePlan(2, 0);  // an older one: no restart
  WritePlan(4, 1);
  RestartPlan next = monitor.TakePlan();
  EXPECT_EQ(next.generation, 4u);
  EXPECT_EQ(next.rank, 1u);
  const std::string log = Log();
  EXPECT_EQ(log.find("generation 2:"), std::string::npos) << log;
  EXPECT_NE(log.find("generation 4: restart requested"), std::string::npos)
      << log;
}

// A plan that cannot be read (reported, not taken) leaves the monitor
// waiting for the next one, which the same notification brings.
TEST_F(RestartMonitorTest, ABadPlanDoesNotHideTheNextOne) {
  RestartMonitor monitor(dir_, 0, std::chrono::hours(24), log_);
  {
    std::ofstream out(dir_ + "/plan.tmp", std::ios::trunc);
    out << "generation=oops\n";
  }
  ASSERT_EQ(std::rename((dir_ + "/plan.tmp").c_str(), (dir_ + "/plan").c_str()),
            0);
  WritePlan(5, 1);
  EXPECT_EQ(monitor.TakePlan().generation, 5u);
}

}  // namespace
}  // namespace ckpt::worker
