#include "util/retry.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

// A stand-in with grpc::Status's accessor (util does not link gRPC).
struct FakeGrpcStatus {
  int code;
  int error_code() const { return code; }
};

TEST(RetryTest, UnreachableIsUnavailableOrDeadlineExceededOnly) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    const bool want = code == absl::StatusCode::kUnavailable ||
                      code == absl::StatusCode::kDeadlineExceeded;
    EXPECT_EQ(IsUnreachable(absl::Status(code, "x")), want) << c;
  }
}

TEST(RetryTest, TransientIsUnreachableOrResourceExhaustedOnly) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    const bool want = code == absl::StatusCode::kUnavailable ||
                      code == absl::StatusCode::kDeadlineExceeded ||
                      code == absl::StatusCode::kResourceExhausted;
    EXPECT_EQ(IsTransient(absl::Status(code, "x")), want) << c;
  }
}

TEST(RetryTest, LoadSheddingIsTransientButNoReasonToFailOver) {
  const absl::Status busy = absl::ResourceExhaustedError("coordinator busy");
  EXPECT_TRUE(IsTransient(busy));
  EXPECT_FALSE(IsUnreachable(busy));
}

TEST(RetryTest, AGrpcStatusIsClassifiedByItsCodeAsAbslWould) {
  for (int c = 0; c <= 16; ++c) {
    const auto code = static_cast<absl::StatusCode>(c);
    EXPECT_EQ(IsTransient(FakeGrpcStatus{c}), IsTransient(code)) << c;
    EXPECT_EQ(IsUnreachable(FakeGrpcStatus{c}), IsUnreachable(code)) << c;
  }
}

TEST(RetryTest, JitterStaysInItsRangeAndSpreads) {
  std::set<int64_t> seen;
  for (int i = 0; i < 200; ++i) {
    const int64_t ms = JitterMs(100, 300).count();
    ASSERT_GE(ms, 100);
    ASSERT_LE(ms, 300);
    seen.insert(ms);
  }
  EXPECT_GT(seen.size(), 20u) << "200 draws in [100, 300] barely differ";
  EXPECT_EQ(JitterMs(50, 10).count(), 50) << "an empty range is its low end";
  for (unsigned attempt : {0u, 3u, 40u}) {
    const int64_t ms = FullJitterBackoff(10, 1000, attempt).count();
    EXPECT_GE(ms, 0);
    EXPECT_LE(ms,
              std::min<int64_t>(1000, int64_t{10} << std::min(attempt, 20u)))
        << attempt;
  }
}

}  // namespace
}  // namespace ckpt
