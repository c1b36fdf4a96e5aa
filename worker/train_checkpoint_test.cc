// TrainCheckpoint against a real ckptd, in process: a restore refuses a
// checkpoint of another world size before it touches a weight, and a restore
// brings back the optimizer's exact state.
#include "worker/train_checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>

#include "tests/harness.h"
#include "worker/host_device.h"

namespace ckpt::worker {
namespace {

using ckpt::testing::DaemonProcess;
using ckpt::testing::TempDir;

MlpConfig Model() {
  return MlpConfig{/*vocab=*/32, /*dim=*/8, /*layers=*/1, /*seq=*/4,
                   /*batch=*/2};
}

struct Optimizer {
  HostBudgetDevice device{1 << 20};
  std::unique_ptr<ChunkedAdam> adam;
};

std::unique_ptr<Optimizer> MakeOptimizer(uint64_t seed) {
  auto o = std::make_unique<Optimizer>();
  std::vector<TensorSpec> specs;
  for (const ParamShape& p : MlpParamShapes(Model()))
    specs.push_back({p.name, p.numel});
  ChunkedAdamOptions opt;
  opt.chunk_elems = 32 * 8;
  auto adam = ChunkedAdam::Create(&o->device, specs, opt);
  EXPECT_TRUE(adam.ok()) << adam.status();
  o->adam = std::move(*adam);
  std::vector<std::vector<float>> init = MlpInitialParams(Model(), seed);
  for (size_t i = 0; i < init.size(); ++i)
    EXPECT_TRUE(o->adam->SetParams(i, init[i]).ok());
  return o;
}

class TrainCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = DaemonProcess::Start(root_.path() + "/root", run_.path(), prefix_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
    auto c = Client::Connect(ckpt::testing::OptionsFor(*daemon_, "tc", 0, 1));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    client_.reset();
    daemon_.reset();
    ckpt::testing::UnlinkArenas(prefix_);
  }

  TempDir root_, run_;
  std::string prefix_ = ckpt::testing::UniqueShmPrefix();
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(TrainCheckpointTest,
       RestoreOfAnotherWorldSizeIsRefusedBeforeAnyWeightIsRead) {
  auto saved = MakeOptimizer(1);
  TrainCheckpoint writer(Model(), /*world_size=*/1, saved->adam.get());
  auto tensors = writer.TensorsFor(3, 77);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_TRUE(client_->Save(3, *tensors).ok());

  auto other = MakeOptimizer(2);
  std::vector<float> before(32 * 8), after(32 * 8);
  ASSERT_TRUE(other->adam->GetParams(0, before).ok());
  TrainCheckpoint reader(Model(), /*world_size=*/2, other->adam.get());
  absl::StatusOr<RestoredState> r = reader.Restore(*client_, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(r.status().message())
                .find("world size 1, this run has world size 2"),
            std::string::npos)
      << r.status();
  ASSERT_TRUE(other->adam->GetParams(0, after).ok());
  EXPECT_EQ(before, after);
}

TEST_F(TrainCheckpointTest, RestoreBringsBackWeightsMomentsStepAndSeed) {
  auto saved = MakeOptimizer(1);
  size_t n = MlpParamShapes(Model()).size();
  for (int step = 0; step < 2; ++step) {
    for (size_t i = 0; i < n; ++i) {
      std::vector<float> g(MlpParamShapes(Model())[i].numel,
                           0.01f * float(i + 1));
      ASSERT_TRUE(saved->adam->SetGradients(i, g).ok());
    }
    ASSERT_TRUE(saved->adam->Step().ok());
  }
  TrainCheckpoint writer(Model(), 1, saved->adam.get());
  auto tensors = writer.TensorsFor(2, 77);
  ASSERT_TRUE(tensors.ok());
  ASSERT_TRUE(client_->Save(2, *tensors).ok());

  auto restored = MakeOptimizer(2);
  TrainCheckpoint reader(Model(), 1, restored->adam.get());
  absl::StatusOr<RestoredState> r = reader.Restore(*client_, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 2);
  EXPECT_EQ(r->data_seed, 77u);
  EXPECT_EQ(restored->adam->step(), 2);
  for (size_t i = 0; i < n; ++i) {
    auto a = saved->adam->MasterStateOf(i),
         b = restored->adam->MasterStateOf(i);
    ASSERT_TRUE(a.ok() && b.ok());
    size_t numel = MlpParamShapes(Model())[i].numel;
    EXPECT_EQ(std::memcmp(a->p, b->p, 4 * numel), 0) << i;
    EXPECT_EQ(std::memcmp(a->m, b->m, 4 * numel), 0) << i;
    EXPECT_EQ(std::memcmp(a->v, b->v, 4 * numel), 0) << i;
    std::vector<uint16_t> wa(numel), wb(numel);
    ASSERT_TRUE(saved->adam->GetParamsBf16(i, wa).ok());
    ASSERT_TRUE(restored->adam->GetParamsBf16(i, wb).ok());
    EXPECT_EQ(wa, wb) << i;
  }
}

// A checkpoint with this model's meta whose tensors do not match the model:
// one reshaped, one missing. Each restore fails naming the tensor.
TEST_F(TrainCheckpointTest, RestoreOfMismatchedTensorIsRefusedNamingIt) {
  auto saved = MakeOptimizer(1);
  TrainCheckpoint writer(Model(), 1, saved->adam.get());
  auto tensors = writer.TensorsFor(4, 77);
  ASSERT_TRUE(tensors.ok());
  ASSERT_EQ((*tensors)[3].name, "param/1");
  (*tensors)[3].shape = {4, 16};  // block0.w is 8 x 8: same bytes, other shape
  ASSERT_TRUE(client_->Save(4, *tensors).ok());
  auto restored = MakeOptimizer(2);
  TrainCheckpoint reader(Model(), 1, restored->adam.get());
  absl::StatusOr<RestoredState> r = reader.Restore(*client_, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("param/1"),
            std::string::npos)
      << r.status();

  tensors = writer.TensorsFor(5, 77);
  ASSERT_TRUE(tensors.ok());
  ASSERT_EQ((*tensors)[8].name, "adam_v/2");
  tensors->erase(tensors->begin() + 8);
  ASSERT_TRUE(client_->Save(5, *tensors).ok());
  r = reader.Restore(*client_, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("adam_v/2"),
            std::string::npos)
      << r.status();
}

// Elastic continuation: a step saved by rank 1 of 2 comes back into a run
// of world size 1 as saved rank 1 (ckptd serves another rank's shard to
// this rank), its meta checked against the saved world size; the same
// checkpoint without the saved rank is refused as before.
TEST_F(TrainCheckpointTest, SavedRankOfAnotherWorldSizeRestoresExactState) {
  auto c = Client::Connect(ckpt::testing::OptionsFor(*daemon_, "el", 1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  auto saved = MakeOptimizer(1);
  TrainCheckpoint writer(Model(), /*world_size=*/2, saved->adam.get());
  auto tensors = writer.TensorsFor(6, 77);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_TRUE((*c)->Save(6, *tensors).ok());
  c->reset();

  // The job resized under a newer generation of its launcher's plan.
  ClientOptions resized = ckpt::testing::OptionsFor(*daemon_, "el", 0, 1);
  resized.generation = 1;
  auto one = Client::Connect(resized);
  ASSERT_TRUE(one.ok()) << one.status();
  auto restored = MakeOptimizer(2);
  TrainCheckpoint reader(Model(), /*world_size=*/1, restored->adam.get());
  absl::StatusOr<RestoredState> r = reader.Restore(**one, 6);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound)
      << "rank 0 saved nothing: " << r.status();
  r = reader.Restore(**one, 6, SavedRank{1, 3});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();
  EXPECT_NE(std::string(r.status().message())
                .find("world size 2, the saved rank's world size is 3"),
            std::string::npos)
      << r.status();
  r = reader.Restore(**one, 6, SavedRank{1, 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 6);
  EXPECT_EQ(r->data_seed, 77u);
  for (size_t i = 0; i < MlpParamShapes(Model()).size(); ++i) {
    auto a = saved->adam->MasterStateOf(i),
         b = restored->adam->MasterStateOf(i);
    ASSERT_TRUE(a.ok() && b.ok());
    const size_t numel = MlpParamShapes(Model())[i].numel;
    EXPECT_EQ(std::memcmp(a->p, b->p, 4 * numel), 0) << i;
    EXPECT_EQ(std::memcmp(a->m, b->m, 4 * numel), 0) << i;
    EXPECT_EQ(std::memcmp(a->v, b->v, 4 * numel), 0) << i;
  }
  // This run saves on, at its own world size, from the restored step.
  auto next =
      TrainCheckpoint(Model(), 1, restored->adam.get()).TensorsFor(8, 77);
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE((*one)->Save(8, *next).ok());
}

}  // namespace
}  // namespace ckpt::worker
