// The real ckptctl binary on an object store root (s3rver started by the
// test), the same commands on a directory for comparison, export to
// safetensors (the file's header parsed here, every tensor's bytes
// compared), and interop with Debian's awscli: it lists our objects and
// downloads a root that ckptctl verify accepts.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#define BOOST_BIND_GLOBAL_PLACEHOLDERS  // quiets boost 1.74 json_parser
// GCC 12 with -fsanitize flags a false -Wmaybe-uninitialized inside
// boost::optional in property_tree's translator (boost 1.74).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>
#pragma GCC diagnostic pop

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/object_backend.h"
#include "storage/shard_testing.h"
#include "tests/s3_server.h"
#include "tests/test_util.h"

namespace ckpt::tools {
namespace {

using ::ckpt::testing::S3Server;

using ShellRun = ::ckpt::testing::CommandResult;

// Runs a shell command with stdout (and, when asked, stderr) captured.
ShellRun Shell(const std::string& cmd, bool with_stderr = false) {
  return ::ckpt::testing::RunCommand(cmd, with_stderr);
}

std::string ReadFile(const std::string& path) {
  return ::ckpt::testing::ReadFileToString(path);
}

class CkptctlObjectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = S3Server::Unavailable(); !why.empty())
      GTEST_SKIP() << why;
    server_ = std::make_unique<S3Server>();
    ASSERT_TRUE(server_->ok());
    // ckptctl and aws read the store's settings from the environment only.
    ::ckpt::testing::ExportS3Environment(server_->endpoint());
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    shard_ = storage::MakeShard({{256, 1024}, {3, 5}, {2048, 600}}, 7);
    key_ =
        storage::ShardKey(shard_.info.job, shard_.info.step, shard_.info.rank);
    absl::StatusOr<std::unique_ptr<storage::Backend>> b =
        storage::NewObjectBackend(server_->Options("team/run1"));
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = *std::move(b);
    auto w = backend_->NewObjectWriter(key_, shard_.image.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(
        (*w)->WriteAt(0, shard_.image.data(), shard_.image.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  std::string Selector(const std::string& root) const {
    return absl::StrFormat("--root %s --job %s --step %d --rank %d", root,
                           shard_.info.job, shard_.info.step, shard_.info.rank);
  }

  static constexpr char kRoot[] = "s3://ckpt-test/team/run1";
  std::unique_ptr<S3Server> server_;
  std::unique_ptr<storage::Backend> backend_;
  storage::Shard shard_;
  std::string key_;
  ::ckpt::testing::TempDir out_;
};

TEST_F(CkptctlObjectTest, ListVerifyInspectRestoreWorkOnAnObjectStoreRoot) {
  ShellRun r = Shell(std::string(CKPTCTL_PATH) + " list --root " + kRoot);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("job-a"), std::string::npos) << r.out;

  r = Shell(std::string(CKPTCTL_PATH) + " verify --root " + kRoot);
  EXPECT_EQ(r.exit_code, 0) << r.out;

  r = Shell(std::string(CKPTCTL_PATH) + " inspect --json " + Selector(kRoot));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("layer2.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string(kRoot) + "/" + key_), std::string::npos)
      << r.out;

  r = Shell(std::string(CKPTCTL_PATH) + " inspect " + kRoot + "/" + key_);
  EXPECT_EQ(r.exit_code, 0) << r.out;

  const std::string copy = out_.path() + "/copy.shard";
  r = Shell(std::string(CKPTCTL_PATH) + " restore --progress " +
            Selector(kRoot) + " --out " + copy);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(ReadFile(copy),
            std::string(shard_.image.data(), shard_.image.size()));
}

TEST_F(CkptctlObjectTest, VerifyOnObjectStoreNamesTheDamagedTensor) {
  std::string damaged(shard_.image.data(), shard_.image.size());
  const storage::ShardTensor& t = shard_.info.tensors[2];
  damaged[t.offset + 5] ^= 0x01;
  ASSERT_TRUE(backend_->PutSmallObject(key_, damaged).ok());
  ShellRun r = Shell(std::string(CKPTCTL_PATH) + " verify --root " + kRoot);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("layer2.weight"), std::string::npos) << r.out;
}

TEST_F(CkptctlObjectTest, MissingCredentialsAreAClearError) {
  unsetenv("AWS_ACCESS_KEY_ID");
  unsetenv("AWS_SECRET_ACCESS_KEY");
  setenv("AWS_SHARED_CREDENTIALS_FILE", (out_.path() + "/none").c_str(), 1);
  ShellRun r = Shell(std::string(CKPTCTL_PATH) + " list --root " + kRoot,
                     /*with_stderr=*/true);
  unsetenv("AWS_SHARED_CREDENTIALS_FILE");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("AWS_ACCESS_KEY_ID"), std::string::npos) << r.out;
}

TEST_F(CkptctlObjectTest, ExportSafetensorsHeaderAndBytesMatchTheShard) {
  const std::string file = out_.path() + "/model.safetensors";
  ShellRun r =
      Shell(std::string(CKPTCTL_PATH) + " export --format safetensors " +
            Selector(kRoot) + " --out " + file);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string st = ReadFile(file);
  ASSERT_GE(st.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = header_len << 8 | static_cast<unsigned char>(st[i]);
  ASSERT_LE(8 + header_len, st.size());
  EXPECT_EQ((8 + header_len) % 8, 0u);
  boost::property_tree::ptree header;
  std::istringstream in(st.substr(8, header_len));
  boost::property_tree::read_json(in, header);
  EXPECT_EQ(header.get<std::string>("__metadata__.format"), "pt");
  EXPECT_EQ(header.get<std::string>("__metadata__.job"), "job-a");
  EXPECT_EQ(header.get<std::string>("__metadata__.step"), "42");
  const char* data = st.data() + 8 + header_len;
  uint64_t end = 0;
  for (const storage::ShardTensor& t : shard_.info.tensors) {
    const boost::property_tree::ptree& e =
        header.get_child(boost::property_tree::path(t.name, '\0'));
    EXPECT_EQ(e.get<std::string>("dtype"), "F32");
    std::vector<uint64_t> shape, offsets;
    for (const auto& [_, v] : e.get_child("shape"))
      shape.push_back(v.get_value<uint64_t>());
    for (const auto& [_, v] : e.get_child("data_offsets"))
      offsets.push_back(v.get_value<uint64_t>());
    EXPECT_EQ(shape, t.shape);
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], end) << "tensors must be packed in order";
    ASSERT_EQ(offsets[1] - offsets[0], t.bytes);
    EXPECT_EQ(
        std::memcmp(data + offsets[0], shard_.image.data() + t.offset, t.bytes),
        0)
        << t.name;
    end = offsets[1];
  }
  EXPECT_EQ(8 + header_len + end, st.size());

  // From a directory the same file comes out.
  storage::LocalBackendOptions lo;
  lo.root = out_.path() + "/root";
  auto local = storage::NewLocalBackend(lo);
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE((*local)
                  ->PutSmallObject(key_, std::string_view(shard_.image.data(),
                                                          shard_.image.size()))
                  .ok());
  const std::string file2 = out_.path() + "/model2.safetensors";
  r = Shell(std::string(CKPTCTL_PATH) + " export " + Selector(lo.root) +
            " --out " + file2);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(ReadFile(file2), st);
}

// A whole step on the object store: rank r holds rows [3r, 3r + 3) of a
// global "w" [6, 4]. export assembles it; reshard writes it at 3 ranks
// into a local root, whose export is the same tensor.
TEST_F(CkptctlObjectTest, ExportAndReshardAStepFromAnObjectStoreRoot) {
  storage::v1::NodeManifest m;
  m.set_job("job-s");
  m.set_step(5);
  m.set_world_size(2);
  std::string global;
  for (uint32_t r = 0; r < 2; ++r) {
    storage::Shard shard = storage::MakeShard(
        {{3, 4}}, 20 + r,
        r == 0 ? +[](storage::ShardInfo& i) {
          i.tensors[0].global_shape = {6, 4};
          i.tensors[0].piece_offsets = {0, 0};
          i.tensors[0].name = "w";
        }
               : +[](storage::ShardInfo& i) {
                   i.tensors[0].global_shape = {6, 4};
                   i.tensors[0].piece_offsets = {3, 0};
                   i.tensors[0].name = "w";
                 });
    shard.info.job = "job-s";
    shard.info.step = 5;
    shard.info.rank = r;
    shard.info.world_size = 2;
    ASSERT_TRUE(storage::EncodeShardMetadata(shard.info, shard.image).ok());
    const std::string key = storage::ShardKey("job-s", 5, r);
    ASSERT_TRUE(backend_
                    ->PutSmallObject(key, std::string_view(shard.image.data(),
                                                           shard.image.size()))
                    .ok());
    const storage::ShardTensor& t = shard.info.tensors[0];
    global.append(shard.image.data() + t.offset, t.bytes);
    auto* s = m.add_shards();
    s->set_rank(r);
    s->set_key(key);
    s->set_bytes(shard.image.size());
    s->set_tensors(1);
    s->set_checksums_digest(
        storage::DigestHex(storage::ChecksumsDigest(shard.info)));
  }
  ASSERT_TRUE(storage::WriteNodeManifest(*backend_, m).ok());

  // The data section of a one-tensor safetensors file.
  auto tensor_of = [](const std::string& file) {
    const std::string st = ReadFile(file);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(st[i]);
    boost::property_tree::ptree header;
    std::istringstream in(st.substr(8, n));
    boost::property_tree::read_json(in, header);
    EXPECT_EQ(header.get<std::string>("w.dtype"), "F32");
    return st.substr(8 + n);
  };
  const std::string step = " --job job-s --step 5";
  const std::string file = out_.path() + "/step.safetensors";
  ShellRun r = Shell(std::string(CKPTCTL_PATH) + " export --root " + kRoot +
                         step + " --out " + file,
                     /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(tensor_of(file) == global);

  const std::string root3 = out_.path() + "/root3";
  r = Shell(std::string(CKPTCTL_PATH) + " reshard --root " + kRoot + step +
                " --world-size 3 --out " + root3,
            /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(
      Shell(std::string(CKPTCTL_PATH) + " verify --root " + root3).exit_code,
      0);
  const std::string file3 = out_.path() + "/step3.safetensors";
  r = Shell(std::string(CKPTCTL_PATH) + " export --root " + root3 + step +
                " --out " + file3,
            /*with_stderr=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(tensor_of(file3) == global);
}

TEST_F(CkptctlObjectTest, AwsCliListsOurObjectsAndItsDownloadVerifies) {
  if (system("command -v aws >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "awscli is not installed";
  const std::string aws = "aws --endpoint-url " + server_->endpoint() + " ";
  ShellRun r = Shell(aws + "s3 ls --recursive s3://ckpt-test/team/run1/");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("team/run1/" + key_), std::string::npos) << r.out;
  const std::string root = out_.path() + "/downloaded";
  r = Shell(aws +
            "s3 cp --only-show-errors --recursive s3://ckpt-test/team/run1 " +
            root);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = Shell(std::string(CKPTCTL_PATH) + " verify --root " + root);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = Shell(std::string(CKPTCTL_PATH) + " inspect " + root + "/" + key_);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

}  // namespace
}  // namespace ckpt::tools
