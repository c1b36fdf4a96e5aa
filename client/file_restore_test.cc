#include "client/file_restore.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace ckpt::client {
namespace {

class ShardFileUsableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/file_restore_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/shard") << std::string(8192, 'x');
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(ShardFileUsableTest, TheRightSizeIsUsable) {
  auto r = ShardFileUsable(dir_ + "/shard", 8192);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
}

TEST_F(ShardFileUsableTest, AnotherSizeOrAMissingFileFallsBack) {
  auto shorter = ShardFileUsable(dir_ + "/shard", 8193);
  ASSERT_TRUE(shorter.ok()) << shorter.status();
  EXPECT_FALSE(*shorter);
  auto missing = ShardFileUsable(dir_ + "/gone", 8192);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(*missing);
}

TEST_F(ShardFileUsableTest, ADirectoryIsAnErrorNamingThePath) {
  auto r = ShardFileUsable(dir_, 8192);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(dir_), absl::string_view::npos);
}

}  // namespace
}  // namespace ckpt::client
