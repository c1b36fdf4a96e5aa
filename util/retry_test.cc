#include "util/retry.h"

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

}  // namespace
}  // namespace ckpt
