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
  EXPECT_TRUE(
      ValidateTensorName("model.layers.0.attn.q_proj.weight", "name").ok());
  EXPECT_FALSE(ValidateTensorName("", "name").ok());
  EXPECT_FALSE(ValidateTensorName(std::string("a\0b", 3), "name").ok());
  EXPECT_FALSE(
      ValidateTensorName(std::string(kMaxTensorNameBytes + 1, 'x'), "name")
          .ok());
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

TEST(ValidateTest, ErrorMessagesQuoteOnlyAPrefixOfALongValue) {
  EXPECT_EQ(QuotePrefix("ab\n"), "\"ab\\n\"");
  std::string quoted = QuotePrefix(std::string(60 << 20, 'x'));
  EXPECT_LT(quoted.size(), 100u);
  EXPECT_NE(quoted.find("... (62914560 bytes)"), std::string::npos) << quoted;
}

TEST(ValidateTest, Utf8AndPrintableChecksRefuseWhatTheyShould) {
  EXPECT_TRUE(IsValidUtf8("plain \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  for (const char* bad : {"\xff", "\xc3", "\xc3(", "\xc0\xaf", "\xed\xa0\x80",
                          "\xf4\x90\x80\x80"})
    EXPECT_FALSE(IsValidUtf8(bad)) << QuotePrefix(bad);
  EXPECT_TRUE(ValidatePrintable("host:1", "address", 16).ok());
  EXPECT_TRUE(ValidatePrintable("", "address", 16, /*allow_empty=*/true).ok());
  EXPECT_FALSE(ValidatePrintable("", "address", 16).ok());
  absl::Status s = ValidatePrintable("h\xffst", "address", 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("address"), std::string_view::npos) << s;
  s = ValidatePrintable(std::string(1 << 20, 'a'), "address", 16);
  EXPECT_LT(s.message().size(), 100u);
}

}  // namespace
}  // namespace ckpt
