#include "util/rpc_service.h"

#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include <string>

namespace ckpt::rpc {
namespace {

// FileDescriptorProto: name = 1 (string), message_type = 4 (repeated
// DescriptorProto, whose name = 1).
const google::protobuf::Descriptor& Type() {
  return *google::protobuf::FileDescriptorProto::descriptor();
}

std::string Describe(const std::string& bytes) {
  return DescribeParseFailure(Type(), bytes);
}

TEST(DescribeParseFailureTest, NamesTheFieldWhereParsingStops) {
  EXPECT_EQ(Describe(std::string("\x0a\x05"
                                 "ab",
                                 4))
                .rfind("name: truncated: 5 bytes declared, 2 left", 0),
            0u)
      << Describe(std::string("\x0a\x05"
                              "ab",
                              4));
  std::string nested = std::string(
                           "\x22\x03\x0a\x01"
                           "A",
                           5) +
                       std::string(
                           "\x22\x04\x0a\x09"
                           "xy",
                           6);
  EXPECT_EQ(Describe(nested).rfind(
                "message_type[1].name: truncated: 9 bytes declared, 2 left", 0),
            0u)
      << Describe(nested);
  EXPECT_EQ(Describe(std::string(12, '\xff'))
                .rfind("request: malformed tag at byte 0", 0),
            0u)
      << Describe(std::string(12, '\xff'));
  EXPECT_EQ(Describe("\x0c").rfind("name: unexpected end-group tag", 0), 0u)
      << Describe("\x0c");
  EXPECT_EQ(Describe("\x0a\x02\xff\xfe").rfind("name: not valid UTF-8", 0), 0u)
      << Describe("\x0a\x02\xff\xfe");
}

TEST(DescribeParseFailureTest, SaysWhichMessageAndHowManyBytes) {
  std::string d =
      Describe(std::string("\x0a\x05"
                           "ab",
                           4));
  EXPECT_NE(d.find("(request google.protobuf.FileDescriptorProto of 4 bytes "
                   "does not parse)"),
            std::string::npos)
      << d;
}

}  // namespace
}  // namespace ckpt::rpc
