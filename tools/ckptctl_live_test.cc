// Runs ckptctl against a real ckptd that holds a checkpoint saved through
// libckpt: list/status as scripts read them (--json), verify of the
// daemon's root, and delete.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "ckpt/client.h"
#include "gtest/gtest.h"
#include "storage/keys.h"
#include "tests/await_file.h"
#include "tests/temp_dir.h"

extern char** environ;

namespace ckpt::tools {
namespace {

int Ckptctl(const std::string& args, std::string* out) {
  FILE* p = popen(
      (std::string(CKPTCTL_PATH) + " " + args + " 2>/dev/null").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class CkptctlLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    socket_ = dir_.path() + "/ckptd.sock";
    root_ = dir_.path() + "/root";
    prefix_ = "ckptctltest" + std::to_string(getpid());
    std::vector<std::string> args = {CKPTD_PATH, "--socket", socket_,
                                     "--root",   root_,      "--shm-prefix",
                                     prefix_};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(
        posix_spawn(&pid_, CKPTD_PATH, nullptr, nullptr, argv.data(), environ),
        0);
    std::string out;
    for (int i = 0;
         i < 200 && Ckptctl("--socket " + socket_ + " status", &out) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(Ckptctl("--socket " + socket_ + " status", &out), 0)
        << "ckptd did not start";

    ClientOptions o;
    o.socket_path = socket_;
    o.job = "livejob";
    o.rank = 0;
    o.world_size = 1;
    auto client = Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    data_.assign(1 << 18, 1.5f);
    Tensor t;
    t.name = "w";
    t.shape = {static_cast<int64_t>(data_.size())};
    t.data = data_.data();
    ASSERT_TRUE((*client)->Save(3, {&t, 1}).ok());
    ASSERT_TRUE((*client)->WaitDurable(3).ok());
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::string name = "/dev/shm/" + prefix_ + ".livejob.r0";
    unlink(name.c_str());
  }

  ckpt::testing::TempDir dir_;
  std::string socket_, root_, prefix_;
  pid_t pid_ = -1;
  std::vector<float> data_;
};

TEST_F(CkptctlLiveTest, ListJsonShowsDurableStep) {
  std::string out;
  ASSERT_EQ(Ckptctl("--socket " + socket_ + " list --json", &out), 0);
  EXPECT_NE(out.find("\"job\":\"livejob\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"step\":3"), std::string::npos) << out;
  EXPECT_NE(out.find("\"durable\":true"), std::string::npos) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1)
      << "one JSON object, one line: " << out;
}

TEST_F(CkptctlLiveTest, StatusJsonNamesTheArena) {
  std::string out;
  ASSERT_EQ(Ckptctl("--socket " + socket_ + " status --json", &out), 0);
  EXPECT_NE(out.find(prefix_ + ".livejob.r0"), std::string::npos) << out;
}

TEST_F(CkptctlLiveTest, VerifyAcceptsTheDaemonsRoot) {
  // WaitDurable answers once the shard is durable; the step's manifest is
  // written after it.
  ASSERT_TRUE(ckpt::testing::AwaitFile(root_ + "/" +
                                       storage::ManifestKey("livejob", 3)));
  std::string out;
  EXPECT_EQ(Ckptctl("verify --root " + root_, &out), 0) << out;
  EXPECT_NE(out.find("1 manifest(s)"), std::string::npos) << out;
}

TEST_F(CkptctlLiveTest, DeleteAllRemovesTheJobsSteps) {
  std::string out;
  ASSERT_EQ(
      Ckptctl("--socket " + socket_ + " delete --job livejob --all", &out), 0)
      << out;
  ASSERT_EQ(Ckptctl("--socket " + socket_ + " list --json --job livejob", &out),
            0)
      << out;
  EXPECT_EQ(out.find("\"step\":3"), std::string::npos) << out;
  EXPECT_NE(Ckptctl("verify --root " + root_ + " --job livejob --step 3", &out),
            0)
      << out;
}

}  // namespace
}  // namespace ckpt::tools
