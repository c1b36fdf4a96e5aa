#include <gtest/gtest.h>

#include <cmath>

#include "worker/chunked_adam.h"
#include "worker/cuda_device.h"
#include "worker/test_util.h"

namespace ckpt::worker {
namespace {

using testing::BitwiseEqual;
using testing::RandomFloats;

// Runs `steps` AdamW steps over n elements on the device's compute queue.
absl::Status DeviceAdam(Device& device, const AdamConfig& config, int steps,
                        std::vector<float>& p, const std::vector<float>& g,
                        std::vector<float>& m, std::vector<float>& v,
                        std::vector<uint16_t>& bf16) {
  const size_t n = p.size();
  absl::StatusOr<void*> mem = device.Allocate(n * 18, "test arrays");
  if (!mem.ok()) return mem.status();
  float* dp = static_cast<float*>(*mem);
  float *dg = dp + n, *dm = dg + n, *dv = dm + n;
  auto* db = reinterpret_cast<uint16_t*>(dv + n);
  absl::Status s;
  using Pair = std::pair<float*, const float*>;
  for (auto [dst, src] : {Pair{dp, p.data()}, Pair{dg, g.data()},
                          Pair{dm, m.data()}, Pair{dv, v.data()}}) {
    if (s.ok()) s = device.CopyToDeviceAsync(Queue::kCompute, dst, src, 4 * n);
  }
  for (int step = 1; step <= steps && s.ok(); ++step) {
    s = device.AdamAsync(Queue::kCompute, MakeStepScalars(config, step),
                         {dp, dg, dm, dv, db, n});
  }
  for (auto [dst, src] :
       {Pair{p.data(), dp}, Pair{m.data(), dm}, Pair{v.data(), dv}}) {
    if (s.ok()) s = device.CopyToHostAsync(Queue::kCompute, dst, src, 4 * n);
  }
  if (s.ok())
    s = device.CopyToHostAsync(Queue::kCompute, bf16.data(), db, 2 * n);
  if (s.ok()) s = device.Synchronize(Queue::kCompute);
  device.Free(dp);
  return s;
}

TEST(CudaAdamTest, KernelMatchesScalarBitwiseAndDoubleReference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto device = MakeCudaDevice(0, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  AdamConfig config;
  for (size_t n :
       {size_t{1}, size_t{17}, size_t{255}, size_t{257}, size_t{100003}}) {
    std::vector<float> p = RandomFloats(n, 3, -1, 1),
                       g = RandomFloats(n, 4, -0.1f, 0.1f);
    std::vector<float> m = RandomFloats(n, 5, -0.01f, 0.01f),
                       v = RandomFloats(n, 6, 0, 1e-4f);
    std::vector<float> cp = p, cm = m, cv = v;
    std::vector<uint16_t> bf16(n), cbf16(n);
    std::vector<double> dp(p.begin(), p.end()), dm(m.begin(), m.end()),
        dv(v.begin(), v.end());
    ASSERT_TRUE(DeviceAdam(**device, config, 3, p, g, m, v, bf16).ok());
    for (int step = 1; step <= 3; ++step) {
      AdamKernelScalar(
          MakeStepScalars(config, step),
          {cp.data(), g.data(), cm.data(), cv.data(), cbf16.data(), n});
      for (size_t i = 0; i < n; ++i)
        AdamElementDouble(config, step, dp[i], g[i], dm[i], dv[i]);
    }
    EXPECT_TRUE(BitwiseEqual(p, cp)) << "n=" << n;
    EXPECT_TRUE(BitwiseEqual(m, cm)) << "n=" << n;
    EXPECT_TRUE(BitwiseEqual(v, cv)) << "n=" << n;
    EXPECT_TRUE(BitwiseEqual(bf16, cbf16)) << "n=" << n;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(p[i], dp[i], 1e-6 * std::fabs(dp[i]) + 1e-8)
          << "n=" << n << " i=" << i;
    }
  }
}

TEST(CudaAdamTest, HybridPlacementOnGpuEqualsAllOnGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  auto device = MakeCudaDevice(0, 0);
  ASSERT_TRUE(device.ok()) << device.status();
  std::vector<TensorSpec> model = {
      {"w", 70001}, {"b", 333}, {"u", 50000}, {"x", 9999}};
  std::vector<std::vector<float>> results[2];
  for (int variant = 0; variant < 2; ++variant) {
    ChunkedAdamOptions o;
    o.chunk_elems = 80000;
    o.offload_fraction = variant == 0 ? 0.0 : 0.5;
    o.cpu_threads = 2;
    auto opt = ChunkedAdam::Create(device->get(), model, o);
    ASSERT_TRUE(opt.ok()) << opt.status();
    for (size_t t = 0; t < model.size(); ++t) {
      ASSERT_TRUE(
          (*opt)->SetParams(t, RandomFloats(model[t].numel, t, -1, 1)).ok());
    }
    for (int step = 1; step <= 3; ++step) {
      for (size_t t = 0; t < model.size(); ++t) {
        ASSERT_TRUE((*opt)
                        ->SetGradients(t, RandomFloats(model[t].numel,
                                                       50 * step + t, -1, 1))
                        .ok());
      }
      ASSERT_TRUE((*opt)->Step().ok());
    }
    for (size_t t = 0; t < model.size(); ++t) {
      results[variant].emplace_back(model[t].numel);
      ASSERT_TRUE((*opt)->GetParams(t, results[variant].back()).ok());
    }
  }
  for (size_t t = 0; t < model.size(); ++t) {
    EXPECT_TRUE(BitwiseEqual(results[0][t], results[1][t])) << model[t].name;
  }
}

}  // namespace
}  // namespace ckpt::worker
