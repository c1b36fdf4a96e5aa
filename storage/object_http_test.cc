// The object store's retry decision travels in the status code.
#include "storage/object_http.h"

#include <string>

#include "gtest/gtest.h"
#include "util/retry.h"

namespace ckpt::storage::internal {
namespace {

TEST(ReplyCodeTest, ThrottlingTimeoutsAndServerErrorsAreTransient) {
  for (long status : {408L, 429L, 500L, 502L, 503L, 504L})
    EXPECT_TRUE(IsTransient(ReplyCode(status, ""))) << status;
  EXPECT_TRUE(IsTransient(ReplyCode(503, "SlowDown")));
}

TEST(ReplyCodeTest, RetriedS3CodesAreTransientWhateverTheirHttpStatus) {
  // The loop retries these; a caller seeing the final status must be told
  // the same (PermissionDenied or InvalidArgument would say "give up").
  for (const char* code : {"SlowDown", "RequestTimeout", "InternalError",
                           "RequestTimeTooSkewed"}) {
    EXPECT_EQ(ReplyCode(400, code), absl::StatusCode::kUnavailable) << code;
    EXPECT_EQ(ReplyCode(403, code), absl::StatusCode::kUnavailable) << code;
  }
}

TEST(ReplyCodeTest, AnswersAreNotTransientAndKeepTheirMeaning) {
  EXPECT_EQ(ReplyCode(404, "NoSuchKey"), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReplyCode(403, "AccessDenied"),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReplyCode(401, ""), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ReplyCode(409, ""), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReplyCode(412, "PreconditionFailed"),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReplyCode(416, ""), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReplyCode(400, "InvalidArgument"),
            absl::StatusCode::kInvalidArgument);
  for (long status : {400L, 401L, 403L, 404L, 409L, 412L, 416L})
    EXPECT_FALSE(IsTransient(ReplyCode(status, "AccessDenied"))) << status;
}

}  // namespace
}  // namespace ckpt::storage::internal
