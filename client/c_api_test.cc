#include <string>
#include <thread>

#include "ckpt/ckpt.h"
#include "gtest/gtest.h"

namespace {

TEST(CApiTest, OptionsInitLeavesEverythingToTheEnvironment) {
  ckpt_options o;
  ckpt_options_init(&o);
  EXPECT_EQ(o.socket_path, nullptr);
  EXPECT_EQ(o.job, nullptr);
  EXPECT_EQ(o.rank, -1);
  EXPECT_EQ(o.world_size, -1);
  EXPECT_EQ(o.block_when_busy, 1);
}

TEST(CApiTest, NullPointersAreInvalidArgumentsNamedInLastError) {
  EXPECT_EQ(ckpt_connect(nullptr, nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("out"), std::string::npos);
  EXPECT_EQ(ckpt_save(nullptr, 1, nullptr, 0), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("client"), std::string::npos);
  ckpt_save_handle* h = reinterpret_cast<ckpt_save_handle*>(1);
  EXPECT_EQ(ckpt_save_async(nullptr, 1, nullptr, 0, &h), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(ckpt_wait(nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(ckpt_wait_copied(nullptr), CKPT_INVALID_ARGUMENT);
  int64_t step = 7;
  EXPECT_EQ(ckpt_latest_step(nullptr, &step), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(step, -1);
  EXPECT_EQ(ckpt_latest_step(nullptr, nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(ckpt_restore(nullptr, 1, nullptr, 0), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(ckpt_wait_durable(nullptr, 1, 10), CKPT_INVALID_ARGUMENT);
}

TEST(CApiTest, ConnectReportsTheBadOption) {
  ckpt_options o;
  ckpt_options_init(&o);
  o.socket_path = "/nonexistent/ckptd.sock";
  o.job = "j";
  o.rank = 0;
  o.world_size = 1;
  o.num_slots = 99;
  ckpt_client* c = reinterpret_cast<ckpt_client*>(1);
  EXPECT_EQ(ckpt_connect(&o, &c), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(ckpt_last_error()).find("num_slots"),
            std::string::npos);
  o.num_slots = 0;
  EXPECT_EQ(ckpt_connect(&o, &c), CKPT_UNAVAILABLE);
  EXPECT_NE(std::string(ckpt_last_error()).find("/nonexistent/ckptd.sock"),
            std::string::npos);
}

TEST(CApiTest, LastErrorIsPerThread) {
  EXPECT_EQ(ckpt_wait(nullptr), CKPT_INVALID_ARGUMENT);
  std::string other;
  std::thread t([&] { other = ckpt_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(ckpt_last_error()), "");
}

}  // namespace
