#include "util/rocks.h"

#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

TEST(RocksTest, OpensCreatingTheDatabaseAndReadsBackAWrite) {
  testing::TempDir dir;
  auto db = OpenRocksDb(dir.path() + "/db", "test store");
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_TRUE((*db)->Put(rocksdb::WriteOptions(), "k", "v").ok());
  std::string v;
  EXPECT_TRUE(FromRocks((*db)->Get(rocksdb::ReadOptions(), "k", &v),
                        "test store", "get")
                  .ok());
  EXPECT_EQ(v, "v");
}

TEST(RocksTest, ASecondOpenOfALockedDatabaseNamesTheStoreAndDirectory) {
  testing::TempDir dir;
  auto first = OpenRocksDb(dir.path() + "/db", "test store");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenRocksDb(dir.path() + "/db", "test store");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(second.status().message().substr(0, 16), "test store: open")
      << second.status();
  EXPECT_NE(second.status().message().find(dir.path()), absl::string_view::npos)
      << second.status();
}

TEST(RocksTest, NotFoundStaysNotFoundNamingWhat) {
  testing::TempDir dir;
  auto db = OpenRocksDb(dir.path() + "/db", "test store");
  ASSERT_TRUE(db.ok()) << db.status();
  std::string v;
  absl::Status s = FromRocks((*db)->Get(rocksdb::ReadOptions(), "gone", &v),
                             "test store", "get gone");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "test store: get gone: not found");
}

}  // namespace
}  // namespace ckpt
