// The fallback ladder, with a real ckptd and the client library: a copy of
// a shard that fails the client's checksum verification is marked bad and
// the restore moves to the next copy (memory, then the file); a step with
// no good copy left is no longer offered by Latest, so the job falls back
// to the previous good step instead of crash-looping on the bad one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>

#include "ckpt/ckpt.h"
#include "shm/arena.h"
#include "storage/keys.h"
#include "storage/shard_format.h"
#include "tests/daemon_test.h"

namespace ckpt::testing {
namespace {

class FallbackTest : public DaemonTest {
 protected:
  // Flips one byte of the first tensor's data in the image at `image`
  // (a slot or a mapped file's first page plus the data).
  static void FlipFirstTensorByte(char* image) {
    auto header = storage::DecodeHeader({image, storage::kShardAlign});
    ASSERT_TRUE(header.ok()) << header.status();
    image[header->data_offset] ^= 0x20;
  }
  HostState state_ = MakeState(8 << 20, 4, 7);
};

TEST_F(FallbackTest, MemoryCopyThatFailsVerificationFallsBackToTheFile) {
  auto client = Connect("mem");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Save(1, state_.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());
  // A stray write lands in the slot that holds step 1.
  const std::string name = "/" + prefix_ + ".mem.r0";
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  auto arena = shm::Arena::Attach(name, static_cast<uint64_t>(st.st_size),
                                  shm::Arena::SlotsOffset());
  ASSERT_TRUE(arena.ok()) << arena.status();
  int slot = -1;
  for (uint32_t i = 0; i < (*arena)->num_slots(); ++i)
    if ((*arena)->slot_state(i) == shm::SlotState::kDurable &&
        (*arena)->header().slots[i].step.load() == 1)
      slot = static_cast<int>(i);
  ASSERT_GE(slot, 0);
  FlipFirstTensorByte((*arena)->slot_data(slot));
  HostState got = state_.EmptyLike();
  absl::Status s = client->Restore(1, got.tensors);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(got.Equals(state_));
}

TEST_F(FallbackTest, StepWithNoGoodCopyLeftIsNoLongerLatest) {
  auto client = Connect("disk");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Save(1, state_.tensors).ok());
  ASSERT_TRUE(client->Save(2, state_.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(2).ok());
  client.reset();
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);  // only the files are left
  FlipFirstTensorByteOfFile(root() + "/" + storage::ShardKey("disk", 2, 0));
  Restart();
  client = Connect("disk");
  ASSERT_NE(client, nullptr);
  HostState got = state_.EmptyLike();
  EXPECT_EQ(client->Restore(2, got.tensors).code(),
            absl::StatusCode::kDataLoss);
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1)
      << "Latest still offers the step that cannot be restored";
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(state_));
}

// Steps 1 and 2 of job `job` with different bytes, durable; then the
// daemon restarts without its shared memory and one byte of step 2's file
// flips, so step 2's only copy fails verification.
class LatestFallbackTest : public FallbackTest {
 protected:
  void SaveTwoStepsAndRotTheSecond(const std::string& job) {
    auto client = Connect(job);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Save(1, state_.tensors).ok());
    ASSERT_TRUE(client->Save(2, second_.tensors).ok());
    ASSERT_TRUE(client->WaitDurable(2).ok());
    client.reset();
    daemon_->Kill(SIGTERM);
    daemon_->Wait();
    UnlinkArenas(prefix_);
    FlipFirstTensorByteOfFile(root() + "/" + storage::ShardKey(job, 2, 0));
    Restart();
  }
  HostState second_ = MakeState(8 << 20, 4, 8);
};

TEST_F(LatestFallbackTest, LatestRestoreFallsBackToThePreviousStepInOneCall) {
  SaveTwoStepsAndRotTheSecond("latest");
  auto client = Connect("latest");
  ASSERT_NE(client, nullptr);
  HostState got = state_.EmptyLike();
  auto step = client->RestoreLatest(got.tensors);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 1);
  EXPECT_TRUE(got.Equals(state_)) << "the tensors hold more than one step";
}

TEST_F(LatestFallbackTest, ExplicitStepWithNoGoodCopyNamesTheStepAndCopies) {
  SaveTwoStepsAndRotTheSecond("explicit");
  auto client = Connect("explicit");
  ASSERT_NE(client, nullptr);
  HostState got = state_.EmptyLike();
  absl::Status s = client->Restore(2, got.tensors);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("restore of step 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s;
  EXPECT_NE(s.message().find("; then "), std::string::npos)
      << "the error names one copy only: " << s;
}

TEST_F(LatestFallbackTest, CApiLatestRestoreFallsBackAndSaysWhichStep) {
  SaveTwoStepsAndRotTheSecond("capi");
  HostState got = state_.EmptyLike();
  std::vector<std::vector<int64_t>> shapes;
  std::vector<ckpt_tensor> ts;
  for (const Tensor& t : got.tensors)
    shapes.emplace_back(t.shape.begin(), t.shape.end());
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    const Tensor& t = got.tensors[i];
    ts.push_back({t.name.c_str(), static_cast<ckpt_dtype>(t.dtype),
                  static_cast<int>(shapes[i].size()), shapes[i].data(), t.data,
                  -1});
  }
  ckpt_options o;
  ckpt_options_init(&o);
  const std::string socket = daemon_->socket();
  o.socket_path = socket.c_str();
  o.job = "capi";
  o.rank = 0;
  o.world_size = 1;
  ckpt_client* c = nullptr;
  ASSERT_EQ(ckpt_connect(&o, &c), CKPT_OK) << ckpt_last_error();
  int64_t step = -7;
  EXPECT_EQ(ckpt_restore_latest(c, ts.data(), ts.size(), &step), CKPT_OK)
      << ckpt_last_error();
  EXPECT_EQ(step, 1);
  EXPECT_TRUE(got.Equals(state_));
  ckpt_close(c);
}

}  // namespace
}  // namespace ckpt::testing
