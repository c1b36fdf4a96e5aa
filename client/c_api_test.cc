#include <cstdlib>
#include <string>
#include <thread>

#include "absl/status/status.h"
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

TEST(CApiTest, OptionsInitSetsEveryCppOptionToItsDefault) {
  ckpt_options o;
  ckpt_options_init(&o);
  EXPECT_EQ(o.slot_bytes, 0u);
  EXPECT_EQ(o.num_slots, 0);  // 2
  EXPECT_EQ(o.copy_threads, 0);
  EXPECT_EQ(o.slot_headroom, 0.0);
  EXPECT_EQ(o.busy_timeout_ms, 600000);
  ckpt_options_init(nullptr);  // ignored, no crash
}

TEST(CApiTest, EveryStatusCodeIsTheAbslCode) {
  using absl::StatusCode;
  EXPECT_EQ(CKPT_OK, static_cast<int>(StatusCode::kOk));
  EXPECT_EQ(CKPT_CANCELLED, static_cast<int>(StatusCode::kCancelled));
  EXPECT_EQ(CKPT_UNKNOWN, static_cast<int>(StatusCode::kUnknown));
  EXPECT_EQ(CKPT_INVALID_ARGUMENT,
            static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_EQ(CKPT_DEADLINE_EXCEEDED,
            static_cast<int>(StatusCode::kDeadlineExceeded));
  EXPECT_EQ(CKPT_NOT_FOUND, static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(CKPT_ALREADY_EXISTS, static_cast<int>(StatusCode::kAlreadyExists));
  EXPECT_EQ(CKPT_PERMISSION_DENIED,
            static_cast<int>(StatusCode::kPermissionDenied));
  EXPECT_EQ(CKPT_RESOURCE_EXHAUSTED,
            static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_EQ(CKPT_FAILED_PRECONDITION,
            static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(CKPT_ABORTED, static_cast<int>(StatusCode::kAborted));
  EXPECT_EQ(CKPT_OUT_OF_RANGE, static_cast<int>(StatusCode::kOutOfRange));
  EXPECT_EQ(CKPT_UNIMPLEMENTED, static_cast<int>(StatusCode::kUnimplemented));
  EXPECT_EQ(CKPT_INTERNAL, static_cast<int>(StatusCode::kInternal));
  EXPECT_EQ(CKPT_UNAVAILABLE, static_cast<int>(StatusCode::kUnavailable));
  EXPECT_EQ(CKPT_DATA_LOSS, static_cast<int>(StatusCode::kDataLoss));
  EXPECT_EQ(CKPT_UNAUTHENTICATED,
            static_cast<int>(StatusCode::kUnauthenticated));
}

TEST(CApiTest, ConnectReportsABadHeadroomOrBusyTimeoutNamingTheOption) {
  ckpt_options o;
  ckpt_options_init(&o);
  o.socket_path = "/nonexistent/ckptd.sock";
  o.job = "j";
  o.rank = 0;
  o.world_size = 1;
  o.slot_headroom = -1;
  ckpt_client* c = reinterpret_cast<ckpt_client*>(1);
  EXPECT_EQ(ckpt_connect(&o, &c), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(ckpt_last_error()).find("slot_headroom"),
            std::string::npos);
  o.slot_headroom = 0.5;
  o.busy_timeout_ms = -5;
  EXPECT_EQ(ckpt_connect(&o, &c), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("busy_timeout"),
            std::string::npos);
}

TEST(CApiTest, BadTensorArgumentsAreInvalidArgumentsNamingTheField) {
  // Tensors are checked before the client, so no daemon is needed.
  auto expect = [](ckpt_status got, const std::string& text) {
    EXPECT_EQ(got, CKPT_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ckpt_last_error()).find(text), std::string::npos)
        << ckpt_last_error();
  };
  expect(ckpt_save(nullptr, 1, nullptr, 3), "tensors: NULL");
  float data[4] = {};
  int64_t shape[2] = {2, 2};
  ckpt_tensor t = {"w", CKPT_FLOAT32, 2, shape, data, -1};
  t.name = nullptr;
  expect(ckpt_restore(nullptr, 1, &t, 1), "tensors[0].name");
  t.name = "w";
  t.ndim = -1;
  expect(ckpt_restore(nullptr, 1, &t, 1), "ndim");
  t.ndim = 2;
  t.shape = nullptr;
  expect(ckpt_save(nullptr, 1, &t, 1), "shape");
  t.shape = shape;
  t.device = -2;
  ckpt_save_handle* h = nullptr;
  expect(ckpt_save_async(nullptr, 1, &t, 1, &h), "device");
  EXPECT_EQ(h, nullptr);
  t.device = -1;
  expect(ckpt_save(nullptr, 1, &t, 1), "client");
  ckpt_close(nullptr);  // ignored, no crash
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

// The C API's launcher rule is the C++ client's (and the Python package's):
// no launcher is rank 0 of 1; a bad variable is named and changes nothing.
TEST(CApiTest, ResolveRankAppliesTheLauncherRule) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(v);
  int rank = -1, world_size = -1, local_rank = 7;
  ASSERT_EQ(ckpt_resolve_rank(&rank, &world_size, &local_rank), CKPT_OK)
      << ckpt_last_error();
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(world_size, 1);
  EXPECT_EQ(local_rank, -1);

  ::setenv("RANK", "abc", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  rank = world_size = -1;
  EXPECT_EQ(ckpt_resolve_rank(&rank, &world_size, nullptr),
            CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("$RANK"), std::string::npos);
  EXPECT_EQ(rank, -1);
  ::setenv("RANK", "2", 1);
  EXPECT_EQ(ckpt_resolve_rank(&rank, &world_size, nullptr),
            CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("$RANK"), std::string::npos);
  ::setenv("RANK", "1", 1);
  ::setenv("LOCAL_RANK", "x", 1);
  EXPECT_EQ(ckpt_resolve_rank(&rank, &world_size, &local_rank),
            CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("$LOCAL_RANK"),
            std::string::npos);
  ::setenv("LOCAL_RANK", "1", 1);
  ASSERT_EQ(ckpt_resolve_rank(&rank, &world_size, &local_rank), CKPT_OK);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(world_size, 2);
  EXPECT_EQ(local_rank, 1);
  EXPECT_EQ(ckpt_resolve_rank(nullptr, &world_size, nullptr),
            CKPT_INVALID_ARGUMENT);
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK"}) ::unsetenv(v);
}

TEST(CApiTest, AbiVersionIsTheHeaders) {
  EXPECT_EQ(ckpt_abi_version(), CKPT_ABI_VERSION);
}

TEST(CApiTest, LastSaveStatsNeedsAClientAndAnOutput) {
  ckpt_save_stats stats;
  stats.bytes = 9;
  EXPECT_EQ(ckpt_last_save_stats(nullptr, &stats), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(stats.bytes, 0u);
  EXPECT_NE(std::string(ckpt_last_error()).find("client"), std::string::npos);
  EXPECT_EQ(ckpt_last_save_stats(nullptr, nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("out"), std::string::npos);
}

TEST(CApiTest, LastRestoreStatsNeedsAClientAndAnOutput) {
  ckpt_restore_stats stats;
  stats.bytes_read = 9;
  stats.resharded = 1;
  EXPECT_EQ(ckpt_last_restore_stats(nullptr, &stats), CKPT_INVALID_ARGUMENT);
  EXPECT_EQ(stats.bytes_read, 0u);
  EXPECT_EQ(stats.resharded, 0);
  EXPECT_NE(std::string(ckpt_last_error()).find("client"), std::string::npos);
  EXPECT_EQ(ckpt_last_restore_stats(nullptr, nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error()).find("out"), std::string::npos);
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
