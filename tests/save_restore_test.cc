// End-to-end save and restore through a real ckptd process.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "storage/shard_format.h"
#include "tests/daemon_test.h"
#include "tests/eventually.h"

namespace ckpt::testing {
namespace {

class SaveRestoreTest : public DaemonTest {};

TEST_F(SaveRestoreTest, RoundTripIsBitExactFromMemoryAndDisk) {
  auto client = Connect("roundtrip");
  ASSERT_NE(client, nullptr);
  HostState s1 = MakeState(24 << 20, 13, 1);
  HostState s2 = MakeState(24 << 20, 13, 2);
  ASSERT_TRUE(client->Save(1, s1.tensors).ok());
  ASSERT_TRUE(client->Save(2, s2.tensors).ok());
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 2);

  HostState got = s2.EmptyLike();
  ASSERT_TRUE(client->Restore(2, got.tensors).ok());
  EXPECT_TRUE(got.Equals(s2));
  ASSERT_TRUE(client->WaitDurable(2).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());
  HostState got1 = s1.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got1.tensors).ok());
  EXPECT_TRUE(got1.Equals(s1));

  // A third save reuses step 1's slot; step 1 then comes back from disk.
  HostState s3 = MakeState(24 << 20, 13, 3);
  ASSERT_TRUE(client->Save(3, s3.tensors).ok());
  HostState again = s1.EmptyLike();
  ASSERT_TRUE(client->Restore(1, again.tensors).ok());
  EXPECT_TRUE(again.Equals(s1));
  // The node manifest is the persister's next task after the shards are
  // durable (WaitDurable does not wait for it): an event to wait for.
  const std::string manifest =
      root() + "/" + storage::ManifestKey("roundtrip", 2);
  EXPECT_TRUE(Eventually([&] { return std::filesystem::exists(manifest); },
                         std::chrono::seconds(60)))
      << manifest;
}

TEST_F(SaveRestoreTest, RestoreOfASubsetAndOfZeroSizedTensors) {
  auto client = Connect("subset");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(1 << 20, 4, 9);
  float scalar = 3.5f;
  s.tensors.push_back(
      Tensor{"scalar", DType::kFloat32, {}, &scalar, Device::Host()});
  s.tensors.push_back(
      Tensor{"empty", DType::kFloat32, {0, 7}, nullptr, Device::Host()});
  ASSERT_TRUE(client->Save(5, s.tensors).ok());
  float out = 0;
  std::vector<Tensor> want = {
      Tensor{"scalar", DType::kFloat32, {}, &out, Device::Host()},
      Tensor{"empty", DType::kFloat32, {0, 7}, nullptr, Device::Host()}};
  ASSERT_TRUE(client->Restore(5, want).ok());
  EXPECT_EQ(out, 3.5f);
}

TEST_F(SaveRestoreTest, RestoreNamesTheMismatchingTensor) {
  auto client = Connect("mismatch");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(1 << 20, 3, 4);
  ASSERT_TRUE(client->Save(1, s.tensors).ok());
  HostState got = s.EmptyLike();
  got.tensors[1].dtype = DType::kFloat64;
  absl::Status st = client->Restore(1, got.tensors);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(s.tensors[1].name), absl::string_view::npos)
      << st;
  HostState unknown = s.EmptyLike();
  unknown.tensors[0].name = "no.such.tensor";
  st = client->Restore(1, unknown.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("no.such.tensor"), absl::string_view::npos) << st;
  HostState shape = s.EmptyLike();
  shape.tensors[2].shape = {1, 2, 3};
  st = client->Restore(1, shape.tensors);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(s.tensors[2].name), absl::string_view::npos)
      << st;
  EXPECT_EQ(client->Restore(7, s.EmptyLike().tensors).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SaveRestoreTest, FourRanksSaveAtOnce) {
  constexpr int kRanks = 4;
  std::vector<HostState> states[kRanks];
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < kRanks; ++r) {
    for (int step = 1; step <= 3; ++step)
      states[r].push_back(MakeState(16 << 20, 8, r * 10 + step));
  }
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      auto c = Client::Connect(OptionsFor(*daemon_, "fourranks", r, kRanks));
      if (!c.ok()) {
        ++failures;
        return;
      }
      for (int step = 1; step <= 3; ++step)
        if (!(*c)->Save(step, states[r][step - 1].tensors).ok()) ++failures;
      if (!(*c)->WaitDurable(3).ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (int r = 0; r < kRanks; ++r) {
    auto c = Connect("fourranks", r, kRanks);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(*c->LatestStep(), 3);
    for (int step = 2; step <= 3; ++step) {
      HostState got = states[r][step - 1].EmptyLike();
      ASSERT_TRUE(c->Restore(step, got.tensors).ok())
          << "rank " << r << " step " << step;
      EXPECT_TRUE(got.Equals(states[r][step - 1]))
          << "rank " << r << " step " << step;
    }
  }
  // The manifest of a step is written once every rank is durable.
  for (int step = 1; step <= 3; ++step)
    EXPECT_TRUE(std::filesystem::exists(
        root() + "/" + storage::ManifestKey("fourranks", step)));
}

TEST_F(SaveRestoreTest, SaveAsyncLetsTheCallerGoOnAfterTheCopy) {
  auto client = Connect("async");
  ASSERT_NE(client, nullptr);
  HostState s = MakeState(32 << 20, 5, 5);
  HostState copy = s.EmptyLike();
  copy.buffers = s.buffers;
  auto handle = client->SaveAsync(1, s.tensors);
  ASSERT_TRUE(handle.ok()) << handle.status();
  ASSERT_TRUE(handle->WaitCopied().ok());
  for (auto& b : s.buffers) std::fill(b.begin(), b.end(), 0x5a);  // allowed now
  ASSERT_TRUE(handle->Wait().ok());
  HostState got = copy.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  for (size_t i = 0; i < got.buffers.size(); ++i)
    EXPECT_EQ(got.buffers[i], copy.buffers[i]);
}

TEST_F(SaveRestoreTest, StateBeyondAFixedSlotSizeIsRefusedNamingBothSizes) {
  ClientOptions o = OptionsFor(*daemon_, "fixed", 0, 1);
  o.slot_bytes = 4 << 20;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  HostState small = MakeState(1 << 20, 2, 7);
  ASSERT_TRUE((*c)->Save(1, small.tensors).ok());
  HostState big = MakeState(16 << 20, 2, 8);
  absl::Status st = (*c)->Save(2, big.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find("bytes"), absl::string_view::npos) << st;
  // The earlier step is untouched and the client goes on working.
  HostState got = small.EmptyLike();
  ASSERT_TRUE((*c)->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(small));
  HostState dup = MakeState(1 << 20, 2, 9);
  dup.tensors[1].name = dup.tensors[0].name;
  st = (*c)->Save(3, dup.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(dup.tensors[0].name), absl::string_view::npos)
      << st;
}

TEST_F(SaveRestoreTest, NonBlockingSaveReportsBusyInsteadOfDropping) {
  ClientOptions o = OptionsFor(*daemon_, "busy", 0, 1);
  o.block_when_busy = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  HostState s = MakeState(64 << 20, 4, 6);
  int ok = 0, busy = 0;
  for (int step = 1; step <= 6; ++step) {
    absl::Status st = (*c)->Save(step, s.tensors);
    if (st.ok())
      ++ok;
    else if (st.code() == absl::StatusCode::kResourceExhausted)
      ++busy;
    else
      ADD_FAILURE() << st;
  }
  EXPECT_GE(ok, 2);
  EXPECT_EQ(ok + busy, 6);
  // Whatever was accepted becomes durable; nothing was dropped silently.
  auto latest = (*c)->LatestStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_TRUE((*c)->WaitDurable(*latest).ok());
}

}  // namespace
}  // namespace ckpt::testing
