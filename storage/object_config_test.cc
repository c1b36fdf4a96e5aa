// ResolveObjectStoreOptions: the s3:// URL, config keys, AWS environment and
// shared credentials file, and the refusals (no server needed).
#include "storage/object_config.h"

#include <cstdio>
#include <map>

#include "gtest/gtest.h"
#include "storage/object_backend.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

TEST(ObjectOptionsTest, ResolvesUrlEnvironmentAndCredentialsFile) {
  ::ckpt::testing::TempDir dir;
  const std::string creds = dir.path() + "/credentials";
  FILE* f = std::fopen(creds.c_str(), "w");
  std::fputs(
      "# comment\n[default]\naws_access_key_id = DEF\naws_secret_access_key = "
      "defsecret\n"
      "[ci]\naws_access_key_id=CIKEY\naws_secret_access_key=cisecret\naws_"
      "session_token=tok\n",
      f);
  std::fclose(f);
  std::map<std::string, std::string> env = {
      {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
      {"AWS_SHARED_CREDENTIALS_FILE", creds},
      {"AWS_PROFILE", "ci"},
      {"AWS_REGION", "eu-west-1"}};
  EnvLookup lookup = [&](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  absl::StatusOr<ObjectStoreOptions> o =
      ResolveObjectStoreOptions("s3://my-bucket/a/b/", {}, lookup);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(o->bucket, "my-bucket");
  EXPECT_EQ(o->prefix, "a/b");
  EXPECT_EQ(o->region, "eu-west-1");
  EXPECT_EQ(o->credentials.access_key_id, "CIKEY");
  EXPECT_EQ(o->credentials.session_token, "tok");

  env["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  env["AWS_SECRET_ACCESS_KEY"] = "envsecret";
  ObjectStoreConfig config;
  config.part_size_mib = 32;
  config.addressing = "virtual";
  o = ResolveObjectStoreOptions("s3://my-bucket", config, lookup);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->credentials.access_key_id, "ENVKEY");
  EXPECT_EQ(o->part_size, 32u << 20);
  EXPECT_EQ(o->addressing, ObjectAddressing::kVirtualHost);

  config.part_size_mib = 1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveObjectStoreOptions("s3://my-bucket", config, lookup).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveObjectStoreOptions("s3://B", {}, lookup).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveObjectStoreOptions("s3://bkt/a/../b", {}, lookup).status()));
  env.clear();
  absl::Status s = ResolveObjectStoreOptions("s3://bkt", {}, lookup).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("AWS_ACCESS_KEY_ID"), std::string::npos) << s;
}

TEST(ObjectOptionsTest, ConfigKeysAreReadAndBadTypesNamed) {
  toml::table t = toml::parse(R"(
object_endpoint = "http://10.0.0.1:9000"
object_addressing = "path"
object_part_mib = 32
object_concurrency = 12
object_verify_md5 = false
)");
  ObjectStoreConfig c;
  ASSERT_TRUE(ReadObjectStoreConfig(t, &c).ok());
  EXPECT_EQ(c.endpoint, "http://10.0.0.1:9000");
  EXPECT_EQ(c.part_size_mib, 32u);
  EXPECT_EQ(c.concurrency, 12u);
  EXPECT_EQ(c.verify_part_md5, false);
  EXPECT_FALSE(c.region.has_value());

  toml::table bad = toml::parse("object_concurrency = \"eight\"\n");
  absl::Status s = ReadObjectStoreConfig(bad, &c);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("object_concurrency"), std::string::npos) << s;
}

}  // namespace
}  // namespace ckpt::storage
