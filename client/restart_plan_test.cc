#include "client/restart_plan.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ckpt/ckpt.h"
#include "ckpt/client.h"
#include "gtest/gtest.h"

namespace ckpt::restart {
namespace {

RestartPlan Sample() {
  RestartPlan p;
  p.generation = 7;
  p.rank = 3;
  p.world_size = 8;
  p.local_rank = 1;
  p.local_world_size = 4;
  p.master_addr = "10.0.0.5";
  p.master_port = 29507;
  p.restore_step = 120;
  return p;
}

TEST(RestartPlanTest, APlanReadsBackAsWritten) {
  auto p = ParsePlan(FormatPlan(Sample()));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->generation, 7u);
  EXPECT_EQ(p->rank, 3u);
  EXPECT_EQ(p->world_size, 8u);
  EXPECT_EQ(p->local_rank, 1u);
  EXPECT_EQ(p->local_world_size, 4u);
  EXPECT_EQ(p->master_addr, "10.0.0.5");
  EXPECT_EQ(p->master_port, 29507u);
  EXPECT_EQ(p->restore_step, 120);
  RestartPlan fresh = Sample();
  fresh.restore_step.reset();
  auto f = ParsePlan(FormatPlan(fresh));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->restore_step.has_value());
}

TEST(RestartPlanTest, UnknownKeysOfANewerLauncherAreIgnored) {
  auto p = ParsePlan(FormatPlan(Sample()) + "spare_hint=b\n");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rank, 3u);
}

// Each bad or missing key is refused naming it.
TEST(RestartPlanTest, ABadPlanIsRefusedNamingTheKey) {
  const std::string good = FormatPlan(Sample());
  struct Case {
    std::string from, to, key;
  };
  const Case cases[] = {
      {"generation=7\n", "", "generation is missing"},
      {"generation=7", "generation=-1", "generation"},
      {"rank=3", "rank=8", "rank"},
      {"world_size=8", "world_size=0", "world_size"},
      {"local_rank=1", "local_rank=4", "local_rank"},
      {"local_world_size=4", "local_world_size=9", "local_world_size"},
      {"master_port=29507", "master_port=70000", "master_port"},
      {"master_port=29507", "master_port=x", "master_port"},
      {"master_addr=10.0.0.5", "master_addr=", "master_addr"},
      {"master_addr=10.0.0.5", "master_addr=a b", "master_addr"},
      {"restore_step=120", "restore_step=-5", "restore_step"},
      {"rank=3\n", "rank=3\nrank=4\n", "rank is given twice"},
      {"rank=3\n", "rank 3\n", "is not key=value"},
  };
  for (const Case& c : cases) {
    std::string text = absl::StrReplaceAll(good, {{c.from, c.to}});
    ASSERT_NE(text, good) << c.from;
    auto p = ParsePlan(text);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.key), std::string::npos)
        << p.status() << " should name " << c.key;
  }
}

TEST(RestartPlanTest, CapableAndJoinedNameTheirKey) {
  EXPECT_EQ(*ParseCapable(FormatCapable(42)), 42);
  EXPECT_EQ(*ParseJoined(FormatJoined(9)), 9u);
  auto c = ParseCapable("pid=0\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("capable: pid"), std::string::npos)
      << c.status();
  auto j = ParseJoined("gen=3\n");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("joined: generation is missing"),
            std::string::npos)
      << j.status();
}

class RestartDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-restart-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ASSERT_EQ(setenv(kDirVariable, dir_.c_str(), 1), 0);
  }
  void TearDown() override {
    unsetenv(kDirVariable);
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(RestartDirTest, PollSeesOnlyANewerGeneration) {
  auto none = PollRestart(0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value()) << "no plan written yet";
  ASSERT_TRUE(WriteFile(dir_, kPlanFile, FormatPlan(Sample())).ok());
  auto same = PollRestart(7);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_FALSE(same->has_value()) << "generation 7 is not newer than 7";
  auto newer = PollRestart(6);
  ASSERT_TRUE(newer.ok()) << newer.status();
  ASSERT_TRUE(newer->has_value());
  EXPECT_EQ((*newer)->generation, 7u);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/plan.tmp"));
}

TEST_F(RestartDirTest, EnableAndJoinedWriteWhatTheLauncherReads) {
  ASSERT_TRUE(EnableRestart().ok());
  auto capable = ReadFile(dir_, kCapableFile);
  ASSERT_TRUE(capable.ok()) << capable.status();
  EXPECT_EQ(*ParseCapable(*capable), getpid());
  ASSERT_TRUE(JoinedRestart(5).ok());
  EXPECT_EQ(*ParseJoined(*ReadFile(dir_, kJoinedFile)), 5u);
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/joined").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(RestartDirTest, AnOversizedOrLinkedPlanIsRefusedUnparsed) {
  {
    std::ofstream f(dir_ + "/plan");
    f << FormatPlan(Sample()) << std::string(kMaxFileBytes, '#');
  }
  auto big = PollRestart(0);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("longer than"), std::string::npos)
      << big.status();
  std::filesystem::remove(dir_ + "/plan");
  ASSERT_TRUE(WriteFile(dir_, "elsewhere", FormatPlan(Sample())).ok());
  std::filesystem::create_symlink(dir_ + "/elsewhere", dir_ + "/plan");
  auto linked = PollRestart(0);
  ASSERT_FALSE(linked.ok());
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos)
      << linked.status();
}

TEST_F(RestartDirTest, TheCApiFillsThePlanOnlyWhenFresh) {
  ckpt_plan plan{};
  int fresh = -1;
  ASSERT_EQ(ckpt_restart_poll(0, &plan, &fresh), CKPT_OK) << ckpt_last_error();
  EXPECT_EQ(fresh, 0);
  ASSERT_TRUE(WriteFile(dir_, kPlanFile, FormatPlan(Sample())).ok());
  ASSERT_EQ(ckpt_restart_poll(0, &plan, &fresh), CKPT_OK) << ckpt_last_error();
  ASSERT_EQ(fresh, 1);
  EXPECT_EQ(plan.generation, 7u);
  EXPECT_EQ(plan.rank, 3u);
  EXPECT_STREQ(plan.master_addr, "10.0.0.5");
  EXPECT_EQ(plan.has_restore_step, 1);
  EXPECT_EQ(plan.restore_step, 120);
  ASSERT_TRUE(WriteFile(dir_, kPlanFile, "generation=8\nrank=1\n").ok());
  ckpt_plan before = plan;
  EXPECT_EQ(ckpt_restart_poll(0, &plan, &fresh), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("world_size is missing"),
            std::string::npos)
      << ckpt_last_error();
  EXPECT_EQ(fresh, 0);
  EXPECT_EQ(plan.generation, before.generation) << "a refusal changes nothing";
  EXPECT_EQ(ckpt_restart_poll(0, nullptr, &fresh), CKPT_INVALID_ARGUMENT);
}

TEST(RestartEnvTest, OutsideCkptrunEveryCallIsAFailedPrecondition) {
  unsetenv(kDirVariable);
  EXPECT_EQ(EnableRestart().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ckpt_restart_enable(), CKPT_FAILED_PRECONDITION);
  EXPECT_NE(std::string(ckpt_last_error()).find("CKPT_RESTART_DIR"),
            std::string::npos);
}

}  // namespace
}  // namespace ckpt::restart
