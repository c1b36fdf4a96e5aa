// ckptrun --rendezvous: the real ckptrun against the real coordinator,
// /bin/sh trainers writing their environment. Served by ckptrun (worker),
// the store listens from ckptrun's start, before any trainer, on
// --master-port in every generation, and the trainers are told to be its
// clients; trainer keeps the old per-generation port. Bad values are
// refused naming the flag.
#include <netinet/in.h>
#include <sys/socket.h>

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
