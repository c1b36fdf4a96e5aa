// A job's uid can open its arena's segment read-write, and so truncate it
// under a running ckptd. The daemon must survive that (a CPU access to a
// truncated mapping raises SIGBUS): the job's save fails with an error
// naming its arena, and every other job on the daemon goes on as before.
// A real ckptd; this test acts as the hostile job.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "storage/shard_format.h"
#include "tests/daemon_test.h"
#include "tests/rpc_helpers.h"

namespace ckpt::testing {
namespace {

class ArenaTruncateTest : public RpcDaemonTest {
 protected:
  grpc::Status Commit(const std::string& job, uint64_t step,
                      const v1::BeginSaveResponse& b) {
    v1::CommitSaveRequest req = TwoZeroTensorCommit(job, step, b);
    grpc::ClientContext ctx;
    v1::CommitSaveResponse resp;
    return stub_->CommitSave(&ctx, req, &resp);
  }
  grpc::Status WaitDurable(const std::string& job, uint64_t step) {
    grpc::ClientContext ctx;
    v1::WaitDurableRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_timeout_ms(60000);
    v1::WaitDurableResponse resp;
    return stub_->WaitDurable(&ctx, req, &resp);
  }
  // Fails if the daemon does not answer (it died).
  void ExpectServing() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    v1::StatusResponse resp;
    grpc::Status s = stub_->Status(&ctx, v1::StatusRequest(), &resp);
    int status = 0;
    ASSERT_TRUE(s.ok()) << "ckptd stopped serving: " << s.error_message()
                        << (daemon_->Exited(&status) && WIFSIGNALED(status)
                                ? " (killed by signal " +
                                      std::to_string(WTERMSIG(status)) + ")"
                                : "");
  }
  static uint64_t TwoTensorImageBytes() {
    return storage::ComputeLayout(std::vector<uint64_t>{4096, 4096})
        ->image_bytes;
  }
};

#define EXPECT_NAMES_ARENA(status, arena)                        \
  do {                                                           \
    grpc::Status _s = (status);                                  \
    EXPECT_EQ(_s.error_code(), grpc::StatusCode::DATA_LOSS)      \
        << _s.error_message();                                   \
    EXPECT_NE(_s.error_message().find(arena), std::string::npos) \
        << "the error does not name arena " << arena << ": "     \
        << _s.error_message();                                   \
  } while (0)

TEST_F(ArenaTruncateTest, TruncatedArenaFailsItsSaveAndOtherJobsGoOn) {
  // A job that saves through the client library before and after.
  auto bystander = Connect("bystander");
  ASSERT_NE(bystander, nullptr);
  HostState b1 = MakeState(1 << 20, 3, 1);
  ASSERT_TRUE(bystander->Save(1, b1.tensors).ok());

  // The hostile job saves step 1, begins step 2, and truncates its arena.
  v1::RegisterResponse reg;
  ASSERT_TRUE(Register("hostile", 0, 1, 1 << 20, &reg).ok());
  v1::BeginSaveResponse begin;
  ASSERT_TRUE(BeginSave("hostile", 1, TwoTensorImageBytes(), &begin).ok());
  ASSERT_TRUE(Commit("hostile", 1, begin).ok());
  ASSERT_TRUE(WaitDurable("hostile", 1).ok());
  ASSERT_TRUE(BeginSave("hostile", 2, TwoTensorImageBytes(), &begin).ok());
  const std::string path = "/dev/shm" + reg.shm_name();
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  ASSERT_EQ(ftruncate(fd, 0), 0) << strerror(errno);
  close(fd);

  // Its commit writes the shard's metadata into the slot, which is gone.
  EXPECT_NAMES_ARENA(Commit("hostile", 2, begin), reg.shm_name());
  ExpectServing();
  // Its next save is refused up front.
  EXPECT_NAMES_ARENA(BeginSave("hostile", 3, TwoTensorImageBytes(), &begin),
                     reg.shm_name());
  // Its durable step stays on disk.
  EXPECT_TRUE(WaitDurable("hostile", 1).ok());
  // Registering again replaces the arena, and the job saves again.
  v1::RegisterResponse again;
  ASSERT_TRUE(Register("hostile", 0, 1, 1 << 20, &again).ok());
  ASSERT_TRUE(BeginSave("hostile", 3, TwoTensorImageBytes(), &begin).ok());
  ASSERT_TRUE(Commit("hostile", 3, begin).ok());
  EXPECT_TRUE(WaitDurable("hostile", 3).ok());

  // The other job saves and restores bit-exact.
  HostState b2 = MakeState(1 << 20, 3, 2);
  ASSERT_TRUE(bystander->Save(2, b2.tensors).ok());
  ASSERT_TRUE(bystander->WaitDurable(2).ok());
  HostState got1 = b1.EmptyLike(), got2 = b2.EmptyLike();
  ASSERT_TRUE(bystander->Restore(1, got1.tensors).ok());
  ASSERT_TRUE(bystander->Restore(2, got2.tensors).ok());
  EXPECT_TRUE(got1.Equals(b1));
  EXPECT_TRUE(got2.Equals(b2));
  ExpectServing();
}

}  // namespace
}  // namespace ckpt::testing
