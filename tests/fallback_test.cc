// The fallback ladder, with a real ckptd and the client library: a copy of
// a shard that fails the client's checksum verification is marked bad and
// the restore moves to the next copy (memory, then the file); a step with
// no good copy left is no longer offered by Latest, so the job falls back
// to the previous good step instead of crash-looping on the bad one.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <string>

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

}  // namespace
}  // namespace ckpt::testing
