// Runs the real ckptctl binary against shard files written through the
// storage backend, intact and damaged, and checks exit codes and output.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/shard_testing.h"
#include "tests/temp_dir.h"

namespace ckpt::tools {
namespace {

struct CtlRun {
  int exit_code = -1;
  std::string out;
};

CtlRun Ckptctl(const std::string& args) {
  CtlRun r;
  std::string cmd = std::string(CKPTCTL_PATH) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class CkptctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = storage::MakeShard({{256, 1024}, {3, 5}, {2048, 600}}, 7);
    key_ = storage::ShardKey(shard_.info.job, shard_.info.step, shard_.info.rank);
    storage::LocalBackendOptions o;
    o.root = dir_.path();
    auto backend = storage::NewLocalBackend(o);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto w = (*backend)->NewObjectWriter(key_, shard_.image.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, shard_.image.data(), shard_.image.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    path_ = dir_.path() + "/" + key_;
  }

  void Overwrite(uint64_t offset, const std::string& bytes) {
    FILE* f = fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    fseek(f, static_cast<long>(offset), SEEK_SET);
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }

  std::string Selector() const {
    return absl::StrFormat("--root %s --job %s --step %d --rank %d", dir_.path(), shard_.info.job,
                           shard_.info.step, shard_.info.rank);
  }

  ckpt::testing::TempDir dir_;
  storage::Shard shard_;
  std::string key_;
  std::string path_;
};

TEST_F(CkptctlTest, VerifySucceedsOnIntactShard) {
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyNamesTheDamagedTensor) {
  const storage::ShardTensor& t = shard_.info.tensors[2];
  Overwrite(t.offset + t.bytes / 2, std::string(1, static_cast<char>(~shard_.image[t.offset + t.bytes / 2])));
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("layer2.weight"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layer0.weight"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnTruncatedShard) {
  ASSERT_EQ(truncate(path_.c_str(), static_cast<off_t>(shard_.image.size() - 4096)), 0);
  CtlRun r = Ckptctl("verify --root " + dir_.path() + " --job job-a --step 42");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnGarbageHeader) {
  Overwrite(0, "garbage!");
  CtlRun r = Ckptctl("verify --root " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("\"ok\":false"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsWhenManifestSizeDisagrees) {
  std::string manifest = absl::StrFormat(
      R"({"format":"ckptd-manifest-v1","job":"job-a","step":42,"world_size":1,"shards":[{"rank":1,"key":"%s","bytes":%d,"tensors":3}]})",
      key_, shard_.image.size() + 4096);
  std::ofstream(dir_.path() + "/" + storage::ManifestKey("job-a", 42)) << manifest;
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("manifest says"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnUnknownStep) {
  EXPECT_EQ(Ckptctl("verify --root " + dir_.path() + " --job job-a --step 7").exit_code, 1);
}

TEST_F(CkptctlTest, InspectListsEveryTensor) {
  CtlRun r = Ckptctl("inspect --json " + path_);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const auto& t : shard_.info.tensors) EXPECT_NE(r.out.find(t.name), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"shape\":[3,5]"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, RestoreWritesOneFilePerTensor) {
  std::string out = dir_.path() + "/out/";
  CtlRun r = Ckptctl("restore " + Selector() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const auto& t : shard_.info.tensors)
    EXPECT_EQ(ReadFile(out + t.name + ".bin"), std::string(shard_.image.data() + t.offset, t.bytes));
  EXPECT_NE(ReadFile(out + "index.json").find("layer1.weight"), std::string::npos);
}

TEST_F(CkptctlTest, RestoreCopiesShardFile) {
  std::string out = dir_.path() + "/copy.shard";
  ASSERT_EQ(Ckptctl("restore " + Selector() + " --out " + out).exit_code, 0);
  EXPECT_EQ(ReadFile(out), std::string(shard_.image.data(), shard_.image.size()));
}

TEST_F(CkptctlTest, RestoreRefusesDamagedTensor) {
  const storage::ShardTensor& t = shard_.info.tensors[0];
  Overwrite(t.offset, std::string(1, static_cast<char>(~shard_.image[t.offset])));
  std::string out = dir_.path() + "/copy.shard";
  EXPECT_EQ(Ckptctl("restore " + Selector() + " --out " + out).exit_code, 1);
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST_F(CkptctlTest, ListWithoutDaemonFailsClearly) {
  EXPECT_EQ(Ckptctl("--socket " + dir_.path() + "/nope.sock list").exit_code, 1);
}

}  // namespace
}  // namespace ckpt::tools
