// Refusals change nothing, and what the engine keeps matches what it was
// told: a refused Register records no job, a refused arena growth keeps the
// old arena and its steps, a step whose checksums do not match its bytes is
// never offered as the newest, Status shows a uid only its own arenas,
// deleting every step of a job removes its record and arenas, and shard
// headers carry their creation time. Driven through a real ckptd's socket.
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>

#include "storage/shard_format.h"
#include "tests/daemon_test.h"
#include "tests/rpc_helpers.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

// More than the test machine's /dev/shm holds; below ckptd's max_slot_bytes.
constexpr uint64_t kTooBig = 1ull << 39;

class EngineRefusalTest : public RpcDaemonTest {
 protected:
  void RestartDaemon() {
    stub_.reset();
    daemon_->Kill(SIGKILL);
    daemon_->Wait();
    Start();
    // gRPC may hand the new stub the dead daemon's connection once.
    for (int i = 0; i < 10; ++i) {
      grpc::ClientContext ctx;
      v1::StatusResponse resp;
      if (stub_->Status(&ctx, v1::StatusRequest(), &resp).ok()) break;
    }
  }
  // Two 4 KiB zero tensors; a fresh slot's bytes are zero, so the
  // checksums match unless `corrupt`.
  grpc::Status Commit(const std::string& job, uint64_t step,
                      const v1::BeginSaveResponse& b, bool corrupt = false) {
    v1::CommitSaveRequest req = TwoZeroTensorCommit(job, step, b, corrupt);
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
  v1::ListResponse List(const std::string& job = "") {
    grpc::ClientContext ctx;
    v1::ListRequest req;
    req.set_job(job);
    v1::ListResponse resp;
    grpc::Status s = stub_->List(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  v1::StatusResponse Status() {
    grpc::ClientContext ctx;
    v1::StatusResponse resp;
    EXPECT_TRUE(stub_->Status(&ctx, v1::StatusRequest(), &resp).ok());
    return resp;
  }
  bool ShmExists(const std::string& job) {
    struct stat st;
    return stat(("/dev/shm/" + prefix_ + "." + job + ".r0").c_str(), &st) == 0;
  }
};

TEST_F(EngineRefusalTest, RegisterRefusedForLackOfSharedMemoryRecordsNothing) {
  grpc::Status s = Register("ghost", 0, 4, kTooBig);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_EQ(List().jobs_size(), 0);
  EXPECT_EQ(Status().arenas_size(), 0);
  // Another world size is no conflict: the refused Register left no job.
  ASSERT_TRUE(Register("ghost", 0, 2, 1 << 20).ok());
  v1::ListResponse l = List();
  ASSERT_EQ(l.jobs_size(), 1);
  EXPECT_EQ(l.jobs(0).world_size(), 2u);
  RestartDaemon();
  l = List();
  ASSERT_EQ(l.jobs_size(), 1);
  EXPECT_EQ(l.jobs(0).job(), "ghost");
  EXPECT_EQ(l.jobs(0).world_size(), 2u);
}

TEST_F(EngineRefusalTest, RefusedArenaGrowthKeepsTheArenaAndItsSteps) {
  auto client = Connect("grow");
  ASSERT_NE(client, nullptr);
  HostState state = MakeState(4 << 20, 3, 7);
  ASSERT_TRUE(client->Save(1, state.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());

  grpc::Status s = Register("grow", 0, 1, kTooBig);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();

  // Step 1 is still in the arena's memory, served from there.
  {
    grpc::ClientContext ctx;
    v1::OpenRestoreRequest req;
    req.set_job("grow");
    req.set_step(1);
    v1::OpenRestoreResponse resp;
    ASSERT_TRUE(stub_->OpenRestore(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.source(), v1::RESTORE_SOURCE_MEMORY);
    grpc::ClientContext ctx2;
    v1::CloseRestoreRequest close;
    close.set_job("grow");
    close.set_lease(resp.lease());
    v1::CloseRestoreResponse cr;
    ASSERT_TRUE(stub_->CloseRestore(&ctx2, close, &cr).ok());
  }
  HostState got = state.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(state));
  // And the rank is still registered: saves go on.
  HostState next = MakeState(4 << 20, 3, 8);
  ASSERT_TRUE(client->Save(2, next.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(2).ok());
  got = next.EmptyLike();
  ASSERT_TRUE(client->Restore(2, got.tensors).ok());
  EXPECT_TRUE(got.Equals(next));
}

TEST_F(EngineRefusalTest, StepWhoseChecksumsDoNotMatchIsNotLatest) {
  ASSERT_TRUE(Register("corrupt", 0, 1, 1 << 20).ok());
  v1::BeginSaveResponse b;
  ASSERT_TRUE(BeginSave("corrupt", 1, 16384, &b).ok());
  ASSERT_TRUE(Commit("corrupt", 1, b).ok());
  ASSERT_TRUE(WaitDurable("corrupt", 1).ok());
  ASSERT_TRUE(BeginSave("corrupt", 2, 16384, &b).ok());
  ASSERT_TRUE(
      Commit("corrupt", 2, b, /*corrupt=*/true).ok());  // found at persist
  EXPECT_EQ(WaitDurable("corrupt", 2).error_code(),
            grpc::StatusCode::DATA_LOSS);

  grpc::ClientContext ctx;
  v1::LatestRequest req;
  req.set_job("corrupt");
  v1::LatestResponse latest;
  ASSERT_TRUE(stub_->Latest(&ctx, req, &latest).ok());
  EXPECT_TRUE(latest.found());
  EXPECT_EQ(latest.step(), 1u);
  v1::ListResponse l = List("corrupt");
  ASSERT_EQ(l.jobs_size(), 1);
  for (const v1::StepInfo& step : l.jobs(0).steps())
    EXPECT_EQ(step.complete(), step.step() == 1) << "step " << step.step();
}

TEST_F(EngineRefusalTest, StatusShowsAnotherUidNoArena) {
  ASSERT_TRUE(Register("mine", 0, 1, 1 << 20).ok());
  ASSERT_EQ(Status().arenas_size(), 1);  // root sees every arena
  EXPECT_EQ(RunUidProbe(daemon_->socket(), "mine", "/" + prefix_ + ".mine.r0",
                        "status"),
            0)
      << "32: Status showed the other uid an arena";
}

TEST_F(EngineRefusalTest, DeletingEveryStepRemovesTheJobAndItsArenas) {
  {
    auto client = Connect("gone");
    ASSERT_NE(client, nullptr);
    HostState state = MakeState(1 << 20, 2, 9);
    ASSERT_TRUE(client->Save(1, state.tensors).ok());
    ASSERT_TRUE(client->Save(2, state.tensors).ok());
    ASSERT_TRUE(client->WaitDurable(2).ok());
  }
  ASSERT_TRUE(ShmExists("gone"));
  grpc::ClientContext ctx;
  v1::DeleteRequest del;
  del.set_job("gone");
  del.set_all_steps(true);
  v1::DeleteResponse dr;
  ASSERT_TRUE(stub_->Delete(&ctx, del, &dr).ok());
  EXPECT_EQ(dr.deleted_steps(), 2u);
  EXPECT_EQ(List().jobs_size(), 0);
  EXPECT_EQ(List("gone").jobs_size(), 0);
  EXPECT_EQ(Status().arenas_size(), 0);
  EXPECT_FALSE(ShmExists("gone"));
  RestartDaemon();
  EXPECT_EQ(List().jobs_size(), 0);
  // A later Register creates the job again, with any world size.
  ASSERT_TRUE(Register("gone", 1, 2, 1 << 20).ok());
  ASSERT_EQ(List().jobs_size(), 1);
  EXPECT_EQ(List().jobs(0).world_size(), 2u);
}

TEST_F(EngineRefusalTest, ShardHeaderRecordsItsCreationTime) {
  auto now_ns = [] {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count());
  };
  uint64_t before = now_ns();
  ASSERT_TRUE(Register("dated", 0, 1, 1 << 20).ok());
  v1::BeginSaveResponse b;
  ASSERT_TRUE(BeginSave("dated", 1, 16384, &b).ok());
  EXPECT_EQ(b.slot(), 0u)
      << "the first save takes the slot faulted in at Register";
  ASSERT_TRUE(Commit("dated", 1, b).ok());
  ASSERT_TRUE(WaitDurable("dated", 1).ok());
  uint64_t after = now_ns();
  std::ifstream f(root() + "/" + storage::ShardKey("dated", 1, 0),
                  std::ios::binary);
  ASSERT_TRUE(f.good());
  std::vector<char> head(storage::kShardAlign);
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  auto header = storage::DecodeHeader(head);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_GE(header->created_unix_ns, before);
  EXPECT_LE(header->created_unix_ns, after);
}

}  // namespace
}  // namespace ckpt::testing
