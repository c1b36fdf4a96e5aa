#include "storage/open_backend.h"

#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

OpenBackendOptions Options(std::map<std::string, std::string>* env) {
  OpenBackendOptions o;
  o.field = "--the-field";
  o.env = [env](const char* name) -> std::optional<std::string> {
    auto it = env->find(name);
    if (it == env->end()) return std::nullopt;
    return it->second;
  };
  return o;
}

bool StartsWithField(const absl::Status& s) {
  return s.message().substr(0, 11) == "--the-field";
}

TEST(OpenBackendTest, AnEmptyUrlIsInvalidNamingTheField) {
  std::map<std::string, std::string> env;
  absl::Status s = OpenBackend("", Options(&env)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWithField(s)) << s;
}

TEST(OpenBackendTest, AnotherSchemeIsInvalidNamingTheFieldQuotingAPrefix) {
  std::map<std::string, std::string> env;
  const std::string url = "gs://bucket/" + std::string(100000, 'x');
  absl::Status s = OpenBackend(url, Options(&env)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWithField(s)) << s;
  EXPECT_NE(s.message().find("gs://bucket/"), absl::string_view::npos) << s;
  EXPECT_LT(s.message().size(), 300u);
}

TEST(OpenBackendTest, ARelativeDirectoryIsInvalidUnlessTheCallerAllowsIt) {
  std::map<std::string, std::string> env;
  OpenBackendOptions o = Options(&env);
  absl::Status s = OpenBackend("relative/dir", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWithField(s)) << s;

  o.relative_ok = true;
  o.must_exist = true;  // creates nothing in the test's working directory
  s = OpenBackend("relative/dir", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(StartsWithField(s)) << s;
}

TEST(OpenBackendTest, ABadBucketIsInvalidNamingTheField) {
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "k"},
                                            {"AWS_SECRET_ACCESS_KEY", "s"}};
  absl::Status s = OpenBackend("s3://Not_A_Bucket/p", Options(&env)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(StartsWithField(s)) << s;
}

TEST(OpenBackendTest, MissingCredentialsNameTheFieldAndWhereTheyAreLooked) {
  std::map<std::string, std::string> env;
  absl::Status s = OpenBackend("s3://bucket/p", Options(&env)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StartsWithField(s)) << s;
  EXPECT_NE(s.message().find("AWS_ACCESS_KEY_ID"), absl::string_view::npos)
      << s;
}

TEST(OpenBackendTest, AnS3UrlWithCredentialsIsTheObjectStore) {
  std::map<std::string, std::string> env = {
      {"AWS_ACCESS_KEY_ID", "k"},
      {"AWS_SECRET_ACCESS_KEY", "s"},
      {"AWS_ENDPOINT_URL", "http://127.0.0.1:9/"}};
  auto b = OpenBackend("s3://bucket/prefix", Options(&env));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "s3");  // nothing is sent before the first call
}

TEST(OpenBackendTest, AFileUrlAndAPlainDirectoryAreTheSameLocalRoot) {
  std::map<std::string, std::string> env;
  testing::TempDir dir;
  for (const std::string& url : {"file://" + dir.path(), dir.path()}) {
    auto b = OpenBackend(url, Options(&env));
    ASSERT_TRUE(b.ok()) << url << ": " << b.status();
    EXPECT_EQ((*b)->LocalPath("k"), dir.path() + "/k") << url;
  }
}

TEST(OpenBackendTest, MustExistRefusesAMissingDirectoryAndAFile) {
  std::map<std::string, std::string> env;
  testing::TempDir dir;
  OpenBackendOptions o = Options(&env);
  o.must_exist = true;
  absl::Status s = OpenBackend(dir.path() + "/missing", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(StartsWithField(s)) << s;
  std::ofstream(dir.path() + "/file") << "x";
  s = OpenBackend(dir.path() + "/file", o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(StartsWithField(s)) << s;
  EXPECT_FALSE(std::ifstream(dir.path() + "/missing").good());
}

}  // namespace
}  // namespace ckpt::storage
