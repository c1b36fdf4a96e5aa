// The catalog names every job, its uid and its shards' paths: only
// ckptd's uid may read it. Its directory is mode 0700, whether Open
// creates it or finds it (made by an older daemon, or RocksDB's default).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "daemon/core/catalog.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

mode_t CatalogDirMode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(CatalogModeTest, NewCatalogDirectoryIsReadableOnlyByItsOwner) {
  TempDir dir;
  const std::string path = dir.path() + "/catalog";
  auto catalog = daemon::Catalog::Open(path);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(CatalogDirMode(path), 0700u);
}

TEST(CatalogModeTest, OpenCatalogDirectoryIsClosedToOthers) {
  TempDir dir;
  const std::string path = dir.path() + "/catalog";
  ASSERT_TRUE(daemon::Catalog::Open(path).ok());
  ASSERT_EQ(chmod(path.c_str(), 0755), 0);
  auto catalog = daemon::Catalog::Open(path);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(CatalogDirMode(path), 0700u);
}

}  // namespace
}  // namespace ckpt::testing
