#include "worker/chunked_adam.h"

#include <gtest/gtest.h>

#include "worker/host_device.h"
#include "worker/test_util.h"

namespace ckpt::worker {
namespace {

using testing::BitwiseEqual;
using testing::RandomFloats;

// Sizes are odd on purpose; with 2100-element chunks Next-Fit gives four
// chunks: [a b] [c d] [e] [f].
std::vector<TensorSpec> Model() {
  return {{"a", 1031}, {"b", 517},  {"c", 2049},
          {"d", 33},   {"e", 1500}, {"f", 777}};
}
constexpr size_t kChunk = 2100;

ChunkedAdamOptions Options(double offload_fraction, bool overlap = true) {
  ChunkedAdamOptions o;
  o.chunk_elems = kChunk;
  o.offload_fraction = offload_fraction;
  o.overlap = overlap;
  o.cpu_threads = 3;
  return o;
}

struct Result {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<uint16_t>> bf16;
};

absl::Status Initialize(ChunkedAdam& opt) {
  std::vector<TensorSpec> model = Model();
  for (size_t t = 0; t < model.size(); ++t) {
    absl::Status s =
        opt.SetParams(t, RandomFloats(model[t].numel, 100 + t, -1, 1));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status FeedGradients(ChunkedAdam& opt, int step) {
  std::vector<TensorSpec> model = Model();
  for (size_t t = 0; t < model.size(); ++t) {
    absl::Status s = opt.SetGradients(
        t, RandomFloats(model[t].numel, 1000 * step + t, -0.1f, 0.1f));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

Result Collect(const ChunkedAdam& opt) {
  Result r;
  for (const TensorSpec& t : Model()) {
    size_t i = r.params.size();
    r.params.emplace_back(t.numel);
    r.bf16.emplace_back(t.numel);
    EXPECT_TRUE(opt.GetParams(i, r.params.back()).ok());
    EXPECT_TRUE(opt.GetParamsBf16(i, r.bf16.back()).ok());
  }
  return r;
}

Result Train(const ChunkedAdamOptions& options, int steps,
             size_t* resident = nullptr) {
  HostBudgetDevice device(uint64_t{1} << 30);
  auto opt = ChunkedAdam::Create(&device, Model(), options);
  EXPECT_TRUE(opt.ok()) << opt.status();
  if (!opt.ok()) return {};
  if (resident != nullptr) *resident = (*opt)->resident_chunks();
  EXPECT_TRUE(Initialize(**opt).ok());
  for (int step = 1; step <= steps; ++step) {
    EXPECT_TRUE(FeedGradients(**opt, step).ok());
    absl::Status s = (*opt)->Step();
    EXPECT_TRUE(s.ok()) << s;
  }
  return Collect(**opt);
}

// The same training done tensor by tensor with the scalar kernel.
Result TrainReference(const AdamConfig& config, int steps) {
  Result r;
  std::vector<TensorSpec> model = Model();
  for (size_t t = 0; t < model.size(); ++t) {
    size_t n = model[t].numel;
    std::vector<float> p = RandomFloats(n, 100 + t, -1, 1), m(n), v(n);
    std::vector<uint16_t> bf16(n);
    for (int step = 1; step <= steps; ++step) {
      std::vector<float> g = RandomFloats(n, 1000 * step + t, -0.1f, 0.1f);
      AdamKernelScalar(
          MakeStepScalars(config, step),
          {p.data(), g.data(), m.data(), v.data(), bf16.data(), n});
    }
    r.params.push_back(p);
    r.bf16.push_back(bf16);
  }
  return r;
}

void ExpectSame(const Result& a, const Result& b, const char* what) {
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t t = 0; t < a.params.size(); ++t) {
    EXPECT_TRUE(BitwiseEqual(a.params[t], b.params[t]))
        << what << " tensor " << t;
    EXPECT_TRUE(BitwiseEqual(a.bf16[t], b.bf16[t])) << what << " tensor " << t;
  }
}

TEST(ChunkedAdamTest, HybridPlacementEqualsAllOnOnePlacement) {
  size_t resident_all = 0, resident_half = 0, resident_none = 0;
  Result on_device = Train(Options(0.0), 3, &resident_all);
  Result hybrid = Train(Options(0.5), 3, &resident_half);
  Result on_host = Train(Options(1.0), 3, &resident_none);
  EXPECT_EQ(resident_all, 4u);
  EXPECT_EQ(resident_half, 2u);
  EXPECT_EQ(resident_none, 0u);
  ExpectSame(on_device, hybrid, "all-device vs hybrid");
  ExpectSame(on_host, hybrid, "all-host vs hybrid");
  ExpectSame(TrainReference(AdamConfig{}, 3), hybrid,
             "scalar reference vs hybrid");
}

TEST(ChunkedAdamTest, SerialBaselineEqualsOverlappedPipeline) {
  ExpectSame(Train(Options(0.5, /*overlap=*/false), 2), Train(Options(0.5), 2),
             "serial vs overlapped");
}

TEST(ChunkedAdamTest, OffloadFractionOutsideUnitIntervalFailsBeforeTraining) {
  HostBudgetDevice device(uint64_t{1} << 30);
  for (double f : {-0.5, 1.5}) {
    auto opt = ChunkedAdam::Create(&device, Model(), Options(f));
    ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_NE(std::string(opt.status().message()).find("offload_fraction"),
              std::string::npos);
  }
  EXPECT_EQ(device.used_bytes(), 0u);
}

TEST(ChunkedAdamTest, ChunkSmallerThanLargestTensorFailsNamingIt) {
  HostBudgetDevice device(uint64_t{1} << 30);
  ChunkedAdamOptions o = Options(0.5);
  o.chunk_elems = 2000;
  auto opt = ChunkedAdam::Create(&device, Model(), o);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(opt.status().message()).find("'c'"), std::string::npos);
}

TEST(ChunkedAdamTest, AutoBudgetBelowMinimumFailsBeforeTraining) {
  HostBudgetDevice device(uint64_t{1} << 30);
  ChunkedAdamOptions o = Options(0);
  o.policy = PlacementPolicy::kAuto;
  o.device_budget_bytes = 4 * kChunk * kFixedBytesPerElem - 1;
  auto opt = ChunkedAdam::Create(&device, Model(), o);
  ASSERT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(opt.status().message()).find("device_budget_bytes"),
            std::string::npos);
  EXPECT_EQ(device.used_bytes(), 0u);
}

TEST(ChunkedAdamTest, StaticPlacementAboveDeviceCapacityFailsBeforeTraining) {
  HostBudgetDevice device(4 * kChunk * kFixedBytesPerElem +
                          kChunk * kResidentBytesPerElem);
  EXPECT_FALSE(ChunkedAdam::Create(&device, Model(), Options(0.5)).ok());
  EXPECT_TRUE(ChunkedAdam::Create(&device, Model(), Options(0.75)).ok());
}

TEST(ChunkedAdamTest, AutoPolicyStaysUnderBudgetAsPeakAndBudgetChange) {
  const uint64_t fixed = 4 * kChunk * kFixedBytesPerElem;
  const uint64_t per_chunk = kChunk * kResidentBytesPerElem;
  HostBudgetDevice device(uint64_t{1} << 30);
  ChunkedAdamOptions o = Options(0);
  o.policy = PlacementPolicy::kAuto;
  o.device_budget_bytes = fixed + 5 * per_chunk / 2;  // room for 2.5 chunks
  auto created = ChunkedAdam::Create(&device, Model(), o);
  ASSERT_TRUE(created.ok()) << created.status();
  ChunkedAdam& opt = **created;
  ASSERT_TRUE(Initialize(opt).ok());
  struct Iteration {
    uint64_t peak;
    uint64_t budget;  // 0: unchanged
    size_t expect_resident;
  };
  const Iteration plan[] = {{0, 0, 2},
                            {per_chunk, 0, 1},
                            {per_chunk / 2, 0, 2},
                            {2 * per_chunk + 1, 0, 0},
                            {0, fixed + 4 * per_chunk, 4},
                            {per_chunk + 1, 0, 2}};
  uint64_t budget = o.device_budget_bytes;
  for (size_t it = 0; it < std::size(plan); ++it) {
    ASSERT_TRUE(FeedGradients(opt, it + 1).ok());
    opt.ReportNonModelPeak(plan[it].peak);
    if (plan[it].budget != 0) {
      ASSERT_TRUE(opt.SetDeviceBudget(plan[it].budget).ok());
      budget = plan[it].budget;
    }
    ASSERT_TRUE(opt.Step().ok());
    EXPECT_EQ(opt.resident_chunks(), plan[it].expect_resident)
        << "iteration " << it;
    EXPECT_LE(device.used_bytes() + plan[it].peak, budget)
        << "iteration " << it;
  }
  EXPECT_EQ(opt.SetDeviceBudget(fixed - 1).code(),
            absl::StatusCode::kInvalidArgument);
  // Moving chunks back and forth never changes the arithmetic.
  ExpectSame(TrainReference(AdamConfig{}, std::size(plan)), Collect(opt),
             "auto vs reference");
}

TEST(ChunkedAdamTest, WrongGradientSizeIsRefusedNamingTheTensor) {
  HostBudgetDevice device(uint64_t{1} << 30);
  auto opt = ChunkedAdam::Create(&device, Model(), Options(0.5));
  ASSERT_TRUE(opt.ok());
  absl::Status s = (*opt)->SetGradients(4, std::vector<float>(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("'e'"), std::string::npos);
  EXPECT_FALSE((*opt)->SetGradients(6, std::vector<float>(10)).ok());
}

}  // namespace
}  // namespace ckpt::worker
