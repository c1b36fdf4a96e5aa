#include <cstdlib>
#include <string>

#include "ckpt/client.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Sets (or with nullptr clears) an environment variable for one test.
class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"CKPT_SOCKET", "CKPT_JOB", "RANK", "WORLD_SIZE",
                          "LOCAL_RANK", "CKPT_GENERATION"})
      ::unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  static void Set(const char* var, const char* value) {
    ::setenv(var, value, 1);
  }
  static ClientOptions Full() {
    ClientOptions o;
    o.socket_path = "/run/ckptd.sock";
    o.job = "llama";
    o.rank = 1;
    o.world_size = 2;
    return o;
  }
  static void ExpectInvalid(ClientOptions o, const std::string& names) {
    absl::Status s = o.ResolveFromEnvironment();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(std::string(s.message()).find(names), std::string::npos) << s;
  }
};

TEST_F(EnvTest, GenerationComesFromCkptGeneration) {
  Set("CKPT_GENERATION", "3");
  ClientOptions o = Full();
  ASSERT_TRUE(o.ResolveFromEnvironment().ok());
  EXPECT_EQ(o.generation, std::optional<uint64_t>(3));
  ::unsetenv("CKPT_GENERATION");
  ClientOptions none = Full();
  ASSERT_TRUE(none.ResolveFromEnvironment().ok());
  EXPECT_FALSE(none.generation.has_value());
}

TEST_F(EnvTest, GenerationThatIsNotANumberIsRefusedNamingTheVariable) {
  for (const char* bad : {"abc", "-1", "3x", "99999999999999999999999"}) {
    Set("CKPT_GENERATION", bad);
    ExpectInvalid(Full(), "CKPT_GENERATION");
  }
}

TEST_F(EnvTest, UnsetFieldsComeFromTheEnvironment) {
  Set("CKPT_SOCKET", "/tmp/s.sock");
  Set("CKPT_JOB", "job_1");
  Set("RANK", "3");
  Set("WORLD_SIZE", "8");
  ClientOptions o;
  ASSERT_TRUE(o.ResolveFromEnvironment().ok());
  EXPECT_EQ(o.socket_path, "/tmp/s.sock");
  EXPECT_EQ(o.job, "job_1");
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 8);
}

TEST_F(EnvTest, SetFieldsWinOverTheEnvironment) {
  Set("CKPT_JOB", "other");
  Set("RANK", "0");
  ClientOptions o = Full();
  ASSERT_TRUE(o.ResolveFromEnvironment().ok());
  EXPECT_EQ(o.job, "llama");
  EXPECT_EQ(o.rank, 1);
}

TEST_F(EnvTest, MissingValuesNameFieldAndVariable) {
  ClientOptions o = Full();
  o.socket_path.clear();
  ExpectInvalid(o, "CKPT_SOCKET");
  o = Full();
  o.job.clear();
  ExpectInvalid(o, "CKPT_JOB");
  o = Full();
  o.rank = -1;
  ExpectInvalid(o, "RANK");
  o = Full();
  o.world_size = -1;
  ExpectInvalid(o, "WORLD_SIZE");
}

TEST_F(EnvTest, MalformedVariablesAreNamed) {
  Set("RANK", "two");
  ClientOptions o = Full();
  o.rank = -1;
  ExpectInvalid(o, "$RANK");
  Set("CKPT_JOB", "../etc");
  o = Full();
  o.job.clear();
  ExpectInvalid(o, "$CKPT_JOB");
  Set("WORLD_SIZE", "0");
  o = Full();
  o.world_size = -1;
  ExpectInvalid(o, "world_size");
}

TEST_F(EnvTest, RankMustBeBelowWorldSize) {
  ClientOptions o = Full();
  o.rank = 2;
  ExpectInvalid(o, "rank");
  o.rank = -5;
  ExpectInvalid(o, "rank");
}

// A process no launcher started (no rank, no $RANK, no $WORLD_SIZE) is
// rank 0 of 1, as in the Python front ends.
TEST_F(EnvTest, NoLauncherIsRankZeroOfOne) {
  ClientOptions o = Full();
  o.rank = -1;
  o.world_size = -1;
  ASSERT_TRUE(o.ResolveFromEnvironment().ok());
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.world_size, 1);
}

TEST_F(EnvTest, OnlyRankInTheEnvironmentNamesWorldSize) {
  Set("RANK", "0");
  ClientOptions o = Full();
  o.rank = -1;
  o.world_size = -1;
  ExpectInvalid(o, "$WORLD_SIZE");
}

TEST_F(EnvTest, RankFromTheEnvironmentPastWorldSizeNamesRank) {
  Set("RANK", "2");
  Set("WORLD_SIZE", "2");
  ClientOptions o = Full();
  o.rank = -1;
  o.world_size = -1;
  ExpectInvalid(o, "$RANK");
  Set("RANK", "-1");
  ExpectInvalid(o, "$RANK");
}

TEST_F(EnvTest, MalformedLocalRankIsNamed) {
  Set("LOCAL_RANK", "abc");
  ExpectInvalid(Full(), "$LOCAL_RANK");
  Set("LOCAL_RANK", "-2");
  ExpectInvalid(Full(), "$LOCAL_RANK");
}

TEST_F(EnvTest, ResolveRankReportsLocalRank) {
  int rank = -1, world_size = -1, local_rank = 7;
  ASSERT_TRUE(ResolveRank(&rank, &world_size, &local_rank).ok());
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(world_size, 1);
  EXPECT_EQ(local_rank, -1);
  Set("RANK", "5");
  Set("WORLD_SIZE", "8");
  Set("LOCAL_RANK", "1");
  rank = world_size = -1;
  ASSERT_TRUE(ResolveRank(&rank, &world_size, &local_rank).ok());
  EXPECT_EQ(rank, 5);
  EXPECT_EQ(world_size, 8);
  EXPECT_EQ(local_rank, 1);
}

TEST_F(EnvTest, FieldRangesAreChecked) {
  ClientOptions o = Full();
  o.num_slots = 1;
  ExpectInvalid(o, "num_slots");
  o = Full();
  o.num_slots = 17;
  ExpectInvalid(o, "num_slots");
  o = Full();
  o.slot_headroom = -0.5;
  ExpectInvalid(o, "slot_headroom");
  o = Full();
  o.copy_threads = -1;
  ExpectInvalid(o, "copy_threads");
  o = Full();
  o.busy_timeout = std::chrono::milliseconds(-1);
  ExpectInvalid(o, "busy_timeout");
  o = Full();
  o.socket_path = "/" + std::string(200, 's');
  ExpectInvalid(o, "socket_path");
  o = Full();
  o.job = "bad job";
  ExpectInvalid(o, "job");
}

TEST_F(EnvTest, ConnectRefusesAMissingSocketAsUnavailable) {
  ClientOptions o = Full();
  o.socket_path = "/nonexistent/ckptd.sock";
  auto c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(std::string(c.status().message()).find("/nonexistent/ckptd.sock"),
            std::string::npos);
}

}  // namespace
}  // namespace ckpt
