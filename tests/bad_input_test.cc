// Bad input from outside: RPC fields, other users, scribbled shared memory,
// damaged shard files. The daemon answers with an error naming the field
// and keeps serving; no other job's data is touched.
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "storage/shard_format.h"
#include "tests/daemon_test.h"
#include "tests/rpc_helpers.h"
#include "tests/test_util.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

class BadInputTest : public RpcDaemonTest {
 protected:
  // A commit of two 4 KiB float32 tensors named a and b, at canonical offsets.
  v1::CommitSaveRequest GoodCommit(const std::string& job, uint64_t step,
                                   const v1::BeginSaveResponse& b) {
    return TwoZeroTensorCommit(job, step, b);
  }
  grpc::Status Commit(const v1::CommitSaveRequest& req) {
    grpc::ClientContext ctx;
    v1::CommitSaveResponse resp;
    return stub_->CommitSave(&ctx, req, &resp);
  }
  void ExpectServing() {
    grpc::ClientContext ctx;
    v1::StatusResponse resp;
    EXPECT_TRUE(stub_->Status(&ctx, v1::StatusRequest(), &resp).ok())
        << "daemon stopped serving";
  }
};

#define EXPECT_RPC_ERROR(call, code_, field)                                   \
  do {                                                                         \
    grpc::Status _s = (call);                                                  \
    EXPECT_EQ(_s.error_code(), grpc::StatusCode::code_) << _s.error_message(); \
    EXPECT_NE(_s.error_message().find(field), std::string::npos)               \
        << "message does not name '" << field << "': " << _s.error_message();  \
  } while (0)

// A second ckptd on a root in use is refused by name, pid and all; the first
// keeps serving and its catalog is untouched.
TEST_F(BadInputTest, SecondDaemonOnARootInUseIsRefusedNamingThePid) {
  ASSERT_EQ(Register("keep", 0, 1, 1 << 20).error_code(), grpc::StatusCode::OK);
  TempDir other;
  const std::string cmd = std::string(CKPTD_BINARY) + " --socket " +
                          other.path() + "/s --root " + root() +
                          " --shm-prefix " + UniqueShmPrefix();
  CommandResult r = RunCommand(cmd, /*with_stderr=*/true, 60);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--root: " + root() + ": in use by ckptd pid " +
                       std::to_string(daemon_->pid())),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("Resource temporarily unavailable"), std::string::npos)
      << r.out;
  ExpectServing();
  grpc::ClientContext ctx;
  v1::ListRequest req;
  v1::ListResponse resp;
  ASSERT_TRUE(stub_->List(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.jobs_size(), 1);
  EXPECT_EQ(resp.jobs(0).job(), "keep");
}

TEST_F(BadInputTest, RegisterValidatesEveryField) {
  EXPECT_RPC_ERROR(Register("../etc", 0, 1, 1 << 20), INVALID_ARGUMENT, "job");
  EXPECT_RPC_ERROR(Register("a/b", 0, 1, 1 << 20), INVALID_ARGUMENT, "job");
  EXPECT_RPC_ERROR(Register("", 0, 1, 1 << 20), INVALID_ARGUMENT, "job");
  EXPECT_RPC_ERROR(Register("j", 0, 0, 1 << 20), INVALID_ARGUMENT,
                   "world_size");
  EXPECT_RPC_ERROR(Register("j", 4, 4, 1 << 20), INVALID_ARGUMENT, "rank");
  EXPECT_RPC_ERROR(Register("j", 0, 1, 0), INVALID_ARGUMENT, "slot_bytes");
  // More than /dev/shm can hold: refused now, not a SIGBUS later.
  EXPECT_RPC_ERROR(Register("huge", 0, 1, 1ull << 39), RESOURCE_EXHAUSTED,
                   "huge");
  ASSERT_TRUE(Register("j", 0, 2, 1 << 20).ok());
  // Another world size without a newer generation (a trainer started by
  // hand with the wrong size) is refused; a resized job's trainers carry
  // their plan's generation (JobTableTest covers that).
  EXPECT_RPC_ERROR(Register("j", 1, 3, 1 << 20), INVALID_ARGUMENT,
                   "world_size: 3, but job 'j' has 2");
  ExpectServing();
}

TEST_F(BadInputTest, SaveRpcsRejectBadLeasesSizesAndIndexes) {
  v1::BeginSaveResponse b;
  EXPECT_RPC_ERROR(BeginSave("nosuchjob", 1, 4096, &b), NOT_FOUND, "nosuchjob");
  ASSERT_TRUE(Register("idx", 0, 1, 1 << 20).ok());
  EXPECT_RPC_ERROR(BeginSave("idx", 1, 64 << 20, &b), RESOURCE_EXHAUSTED,
                   "image_bytes");

  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  auto req = GoodCommit("idx", 1, b);
  req.set_lease(b.lease() + 1000);
  EXPECT_RPC_ERROR(Commit(req), NOT_FOUND, "lease");
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(1)->set_name("a");
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT, "\"a\"");  // duplicate name

  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(0)->set_offset(4096);  // overlaps the index
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT, "offset");

  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(0)->set_bytes(1ull << 40);  // beyond the arena
  EXPECT_FALSE(Commit(req).ok());

  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(1)->set_dtype(99);
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT, "dtype");

  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(0)->set_name(std::string("bad\nname"));
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT, "name");

  // Chunk hashes: one per 1 MiB chunk, combining into the checksum.
  // Refused before the lease is looked at, as the name: the same save.
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(0)->add_chunk_hashes(1);
  req.mutable_tensors(0)->add_chunk_hashes(2);
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT,
                   "tensors[0].chunk_hashes: 2 hashes, 4096 bytes have 1 "
                   "chunks");
  req = GoodCommit("idx", 1, b);
  req.mutable_tensors(1)->add_chunk_hashes(req.tensors(1).checksum() ^ 1);
  EXPECT_RPC_ERROR(Commit(req), INVALID_ARGUMENT,
                   "tensors[1].chunk_hashes: they do not combine");

  // After all that, a good commit still works and the step becomes durable.
  ASSERT_TRUE(BeginSave("idx", 1, 16384, &b).ok());
  ASSERT_TRUE(Commit(GoodCommit("idx", 1, b)).ok());
  grpc::ClientContext ctx;
  v1::WaitDurableRequest w;
  w.set_job("idx");
  w.set_step(1);
  v1::WaitDurableResponse wr;
  EXPECT_TRUE(stub_->WaitDurable(&ctx, w, &wr).ok());
  ExpectServing();
}

TEST_F(BadInputTest, AnotherUidCannotTouchTheJob) {
  ASSERT_TRUE(Register("mine", 0, 1, 1 << 20).ok());
  EXPECT_EQ(RunUidProbe(daemon_->socket(), "mine", "/" + prefix_ + ".mine.r0"),
            0)
      << "bitmask of checks that let the other uid in";
  ExpectServing();
}

TEST_F(BadInputTest, ScribbledSharedMemoryHeaderHarmsNobodyElse) {
  auto other = Client::Connect(OptionsFor(*daemon_, "other", 0, 1));
  ASSERT_TRUE(other.ok());
  HostState theirs = MakeState(4 << 20, 3, 31);
  ASSERT_TRUE((*other)->Save(1, theirs.tensors).ok());

  auto client = Client::Connect(OptionsFor(*daemon_, "buggy", 0, 1));
  ASSERT_TRUE(client.ok());
  HostState s = MakeState(4 << 20, 3, 32);
  ASSERT_TRUE((*client)->Save(1, s.tensors).ok());
  ASSERT_TRUE((*client)->WaitDurable(1).ok());
  // A buggy trainer maps its own arena read-write and scribbles the header.
  int fd = shm_open(("/" + prefix_ + ".buggy.r0").c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 0xEE, 4096);
  munmap(p, 4096);
  close(fd);
  // The daemon never trusts the header: saving and restoring go on.
  ASSERT_TRUE((*client)->Save(2, s.tensors).ok());
  HostState got = s.EmptyLike();
  ASSERT_TRUE((*client)->Restore(2, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s));
  ASSERT_TRUE((*client)->WaitDurable(2).ok());
  ASSERT_TRUE((*other)->WaitDurable(1).ok());
  client->reset();
  other->reset();
  // After a restart the scribbled arena is refused, the durable steps are
  // served from disk, and the other job is untouched.
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  Start();
  auto again = Client::Connect(OptionsFor(*daemon_, "buggy", 0, 1));
  ASSERT_TRUE(again.ok());
  HostState got2 = s.EmptyLike();
  ASSERT_TRUE((*again)->Restore(2, got2.tensors).ok());
  EXPECT_TRUE(got2.Equals(s));
  auto other2 = Client::Connect(OptionsFor(*daemon_, "other", 0, 1));
  ASSERT_TRUE(other2.ok());
  HostState got3 = theirs.EmptyLike();
  ASSERT_TRUE((*other2)->Restore(1, got3.tensors).ok());
  EXPECT_TRUE(got3.Equals(theirs));
  ExpectServing();
}

TEST_F(BadInputTest, TruncatedAndGarbageShardFilesAreDataLoss) {
  auto client = Client::Connect(OptionsFor(*daemon_, "damaged", 0, 1));
  ASSERT_TRUE(client.ok());
  HostState s = MakeState(4 << 20, 3, 41);
  for (int step = 1; step <= 3; ++step)
    ASSERT_TRUE((*client)->Save(step, s.tensors).ok());
  ASSERT_TRUE((*client)->WaitDurable(3).ok());
  client->reset();
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  std::string root = this->root() + "/";
  std::filesystem::resize_file(root + storage::ShardKey("damaged", 2, 0),
                               4096 * 3);
  {
    std::string garbage(1 << 20, 'G');
    FILE* f = fopen((root + storage::ShardKey("damaged", 3, 0)).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    fwrite(garbage.data(), 1, garbage.size(), f);
    fclose(f);
  }
  Start();
  auto c = Client::Connect(OptionsFor(*daemon_, "damaged", 0, 1));
  ASSERT_TRUE(c.ok());
  HostState got = s.EmptyLike();
  EXPECT_EQ((*c)->Restore(2, got.tensors).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*c)->Restore(3, got.tensors).code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE((*c)->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s));
  ExpectServing();
}

}  // namespace
}  // namespace ckpt::testing
