// ckptrun --rendezvous: the real ckptrun against the real coordinator,
// /bin/sh trainers writing their environment. Served by ckptrun (worker),
// the store listens from ckptrun's start, before any trainer, on
// --master-port in every generation, and the trainers are told to be its
// clients; trainer keeps the old per-generation port. Served by torch's
// store server, a child, it is started again when it dies. Bad values are
// refused naming the flag.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>

#include "storage/shard_format.h"
#include "tools/ckptrun_fixture.h"

namespace ckpt::tools {
namespace {

// Whether something accepts TCP connections on 127.0.0.1:port.
bool Listens(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

TEST_F(CkptrunTest, ServedStoreListensFromTheStartOnOnePortForEveryGeneration) {
  testing::FakeNode node(coord_->address(), "n1", "", 2);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("fail1", 2, "n1", {"--rendezvous", "worker"});
  ASSERT_TRUE(WaitForEnv(0, {0, 1}));
  // The trainers (sh) listen on nothing: ckptrun does.
  EXPECT_TRUE(Listens(31000)) << ReadFile(log());
  for (auto state : {cv1::STAGED, cv1::DURABLE})
    for (uint32_t r : {0u, 1u}) {
      grpc::Status s = node.ReportShard("train", 7, r, state,
                                        storage::ShardKey("train", 7, r));
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  std::ofstream(dir_.path() + "/fail").put('x');  // rank 1 exits 3
  ASSERT_TRUE(WaitForEnv(1, {0, 1})) << ReadFile(log());
  for (uint64_t g : {0u, 1u})
    for (uint32_t r : {0u, 1u}) {
      auto env = Env(g, r);
      EXPECT_EQ(env["MASTER_PORT"], "31000") << "generation " << g;
      EXPECT_EQ(env["CKPT_RENDEZVOUS"], "launcher") << "generation " << g;
    }
  EXPECT_TRUE(Listens(31000)) << ReadFile(log());
  const std::string text = ReadFile(log());
  size_t first = text.find("serving the rendezvous store (worker) on port");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find("serving the rendezvous store", first + 1),
            std::string::npos)
      << "served again\n"
      << text;
}

TEST_F(CkptrunTest, TrainerRendezvousKeepsThePortPerGenerationAndNoStore) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  // auto: the trainer (/bin/sh) is not ckpt-worker.
  StartCkptrun("sleep", 1);
  ASSERT_TRUE(WaitForEnv(0, {0}));
  EXPECT_EQ(Env(0, 0)["MASTER_PORT"], "31000");
  EXPECT_EQ(Env(0, 0).count("CKPT_RENDEZVOUS"), 0u);
  EXPECT_EQ(ReadFile(log()).find("serving the rendezvous store"),
            std::string::npos)
      << ReadFile(log());
}

// --rendezvous torch: the store is python3 -m ckpt.torch.store_server, a
// child of ckptrun; SIGKILLed, it is started again and serves again.
TEST_F(CkptrunTest, TorchStoreServerIsAChildStartedAgainWhenItDies) {
  if (testing::RunCommand("python3 -c 'import torch'", true).exit_code != 0)
    GTEST_SKIP() << "python3 has no torch";
  // The ckpt package of this tree (tools/../python).
  std::string src = __FILE__;
  src = src.substr(0, src.rfind('/'));
  src = src.substr(0, src.rfind('/'));
  const char* old = std::getenv("PYTHONPATH");
  const std::string saved = old != nullptr ? old : "";
  setenv("PYTHONPATH", (src + "/python").c_str(), 1);
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  StartCkptrun("sleep", 1, "n1", {"--rendezvous", "torch"});
  if (old != nullptr)
    setenv("PYTHONPATH", saved.c_str(), 1);
  else
    unsetenv("PYTHONPATH");
  const std::string serving = "serving the rendezvous store on port 31000";
  // Each start imports torch: seconds on a loaded machine.
  ASSERT_TRUE(WaitFor(
      [&] { return ReadFile(log()).find(serving) != std::string::npos; },
      milliseconds(90000)))
      << ReadFile(log());
  EXPECT_TRUE(Listens(31000));
  ASSERT_TRUE(WaitForEnv(0, {0}));
  EXPECT_EQ(Env(0, 0)["CKPT_RENDEZVOUS"], "launcher");
  const std::string text = ReadFile(log());
  const std::string tag = "-m ckpt.torch.store_server, pid ";
  size_t at = text.find(tag);
  ASSERT_NE(at, std::string::npos) << text;
  const pid_t child = std::atoi(text.c_str() + at + tag.size());
  ASSERT_GT(child, 0) << text;
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string t = ReadFile(log());
        size_t again = t.find("exited; starting another");
        return again != std::string::npos &&
               t.find(serving, again) != std::string::npos;
      },
      milliseconds(90000)))
      << ReadFile(log());
  EXPECT_TRUE(Listens(31000));
  EXPECT_TRUE(Dead(std::to_string(child)));
  // ckptrun's exit takes its store server with it.
  const std::string again = ReadFile(log()).substr(at + tag.size());
  size_t at2 = again.find(tag);
  ASSERT_NE(at2, std::string::npos);
  const std::string child2 =
      std::to_string(std::atoi(again.c_str() + at2 + tag.size()));
  kill(ckptrun_, SIGTERM);
  EXPECT_EQ(WaitCkptrun(milliseconds(10000)), 143);
  EXPECT_TRUE(WaitFor([&] { return Dead(child2); }, milliseconds(5000)));
}

TEST(CkptrunRendezvousFlagsTest, BadRendezvousIsRefusedNamingTheFlag) {
  const std::string ok =
      " --coordinator 127.0.0.1:1 --node-id n1 --nproc-per-node 1 --job j "
      "--socket /s --rendezvous ";
  for (const std::string& args :
       {ok + "bogus -- /bin/true", ok + "'' -- /bin/true",
        "env PATH=/nonexistent " + std::string(CKPTRUN_PATH) + ok +
            "torch -- /bin/true"}) {
    const std::string cmd =
        args.rfind("env ", 0) == 0 ? args : std::string(CKPTRUN_PATH) + args;
    testing::CommandResult r = testing::RunCommand(cmd, true);
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--rendezvous"), std::string::npos) << cmd << "\n"
                                                             << r.out;
  }
}

}  // namespace
}  // namespace ckpt::tools
