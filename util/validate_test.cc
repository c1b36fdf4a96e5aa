#include "util/validate.h"

#include <gtest/gtest.h>

#include <string>

#include "ckpt/tensor.h"

namespace ckpt {
namespace {

TEST(ValidateTest, JobNamesThatWouldEscapeTheRootAreRefused) {
  for (const char* bad : {"", ".", "..", "a/b", "../x", "a..b", ".hidden", "-x",
                          "sp ace", "tab\t"}) {
    absl::Status s = ValidateJobName(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("job"), std::string_view::npos) << s;
  }
  EXPECT_FALSE(ValidateJobName(std::string(128, 'a')).ok());
  EXPECT_TRUE(ValidateJobName(std::string(127, 'a')).ok());
  EXPECT_TRUE(ValidateJobName("llama-70b_run.3").ok());
}

TEST(ValidateTest, TensorNamesMustBePrintableAndShort) {
  EXPECT_TRUE(ValidateTensorName("model.layers.0.attn.q_proj.weight", "name").ok());
  EXPECT_FALSE(ValidateTensorName("", "name").ok());
  EXPECT_FALSE(ValidateTensorName(std::string("a\0b", 3), "name").ok());
  EXPECT_FALSE(ValidateTensorName(std::string(kMaxTensorNameBytes + 1, 'x'), "name").ok());
}

TEST(TensorTest, BytesDetectsOverflowAndNegativeDims) {
  Tensor t{"t", DType::kFloat32, {3, 5}, nullptr, Device::Host()};
  EXPECT_EQ(t.bytes(), 60u);
  t.shape = {-1};
  EXPECT_FALSE(t.bytes().has_value());
  t.shape = {int64_t{1} << 62, 8};
  EXPECT_FALSE(t.bytes().has_value());
  t.shape = {};
  EXPECT_EQ(t.numel(), 1u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeFromName("int64"), DType::kInt64);
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_EQ(Device::Cuda(3).ToString(), "cuda:3");
}

}  // namespace
}  // namespace ckpt
