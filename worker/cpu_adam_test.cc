#include "worker/cpu_adam.h"

#include <gtest/gtest.h>

#include <cmath>

#include "worker/test_util.h"

namespace ckpt::worker {
namespace {

using testing::BitwiseEqual;
using testing::RandomFloats;

struct State {
  std::vector<float> p, g, m, v;
  std::vector<uint16_t> bf16;
  AdamSpan Span() {
    return {p.data(), g.data(), m.data(), v.data(), bf16.data(), p.size()};
  }
};

State MakeState(size_t n, uint32_t seed) {
  State s{RandomFloats(n, seed, -1.0f, 1.0f),
          RandomFloats(n, seed + 1, -0.1f, 0.1f),
          RandomFloats(n, seed + 2, -0.01f, 0.01f),
          RandomFloats(n, seed + 3, 0.0f, 1e-4f), std::vector<uint16_t>(n)};
  return s;
}

struct Kernel {
  const char* name;
  AdamKernel fn;
  bool supported;
};

std::vector<Kernel> AllKernels() {
  __builtin_cpu_init();
  return {
      {"scalar", AdamKernelScalar, true},
      {"avx2", avx2::AdamKernel, __builtin_cpu_supports("avx2") != 0},
      {"avx512", avx512::AdamKernel, __builtin_cpu_supports("avx512f") != 0}};
}

// Sizes straddle both vector widths and are never all multiples of them.
const size_t kSizes[] = {1, 7, 15, 17, 31, 33, 1000, 4099};

TEST(CpuAdamTest, EveryKernelMatchesDoubleReferenceElementByElement) {
  AdamConfig config{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
  for (const Kernel& k : AllKernels()) {
    if (!k.supported) continue;
    for (size_t n : kSizes) {
      State s = MakeState(n, 7 * n);
      std::vector<double> p(s.p.begin(), s.p.end()), m(s.m.begin(), s.m.end()),
          v(s.v.begin(), s.v.end());
      for (int64_t step = 1; step <= 3; ++step) {
        k.fn(MakeStepScalars(config, step), s.Span());
        for (size_t i = 0; i < n; ++i) {
          AdamElementDouble(config, step, p[i], s.g[i], m[i], v[i]);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        ASSERT_NEAR(s.p[i], p[i], 1e-6 * std::fabs(p[i]) + 1e-8)
            << k.name << " n=" << n << " i=" << i;
        // m can cancel (b1 * m and (1 - b1) * g of opposite signs): scale by
        // |g|.
        ASSERT_NEAR(s.m[i], m[i], 1e-6 * (std::fabs(m[i]) + std::fabs(s.g[i])))
            << k.name << " n=" << n;
        ASSERT_NEAR(s.v[i], v[i], 1e-6 * std::fabs(v[i]) + 1e-15)
            << k.name << " n=" << n;
        ASSERT_EQ(s.bf16[i], FloatToBf16(s.p[i]))
            << k.name << " n=" << n << " i=" << i;
      }
    }
  }
}

TEST(CpuAdamTest, SimdKernelsAreBitIdenticalToScalar) {
  AdamConfig config{3e-4f, 0.8f, 0.95f, 1e-6f, 0.1f};
  for (const Kernel& k : AllKernels()) {
    if (!k.supported) continue;
    for (size_t n : kSizes) {
      State a = MakeState(n, 11 * n), b = MakeState(n, 11 * n);
      for (int64_t step = 1; step <= 4; ++step) {
        AdamKernelScalar(MakeStepScalars(config, step), a.Span());
        k.fn(MakeStepScalars(config, step), b.Span());
      }
      EXPECT_TRUE(BitwiseEqual(a.p, b.p)) << k.name << " n=" << n;
      EXPECT_TRUE(BitwiseEqual(a.m, b.m)) << k.name << " n=" << n;
      EXPECT_TRUE(BitwiseEqual(a.v, b.v)) << k.name << " n=" << n;
      EXPECT_TRUE(BitwiseEqual(a.bf16, b.bf16)) << k.name << " n=" << n;
    }
  }
}

TEST(CpuAdamTest, ThreadCountDoesNotChangeAnyBit) {
  AdamConfig config;
  const size_t n = 100003;
  State reference = MakeState(n, 5);
  CpuAdam one(1);
  for (int64_t step = 1; step <= 2; ++step)
    one.Update(MakeStepScalars(config, step), reference.Span());
  for (int threads : {2, 3, 5, 8}) {
    State s = MakeState(n, 5);
    CpuAdam pool(threads);
    for (int64_t step = 1; step <= 2; ++step)
      pool.Update(MakeStepScalars(config, step), s.Span());
    EXPECT_TRUE(BitwiseEqual(reference.p, s.p)) << threads << " threads";
    EXPECT_TRUE(BitwiseEqual(reference.m, s.m)) << threads << " threads";
    EXPECT_TRUE(BitwiseEqual(reference.v, s.v)) << threads << " threads";
    EXPECT_TRUE(BitwiseEqual(reference.bf16, s.bf16)) << threads << " threads";
  }
}

TEST(CpuAdamTest, ParallelForCoversEveryElementExactlyOnce) {
  for (int threads : {1, 3, 4}) {
    CpuAdam pool(threads);
    for (size_t n :
         {size_t{1}, size_t{63}, size_t{65}, size_t{1000}, size_t{12345}}) {
      std::vector<int> hits(n);
      pool.ParallelFor(n, [&](size_t b, size_t e) {
        EXPECT_EQ(b % CpuAdam::kGrain, 0u);
        for (size_t i = b; i < e; ++i) ++hits[i];
      });
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i], 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(CpuAdamTest, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly half-way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is half-way too: ties to even rounds up.
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
}

TEST(CpuAdamTest, ConfigValidationNamesTheField) {
  AdamConfig c;
  c.beta1 = 1.0f;
  absl::Status s = ValidateAdamConfig(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("beta1"), std::string::npos);
  c = AdamConfig{};
  c.eps = 0;
  EXPECT_NE(std::string(ValidateAdamConfig(c).message()).find("eps"),
            std::string::npos);
  c = AdamConfig{};
  c.lr = NAN;
  EXPECT_FALSE(ValidateAdamConfig(c).ok());
  EXPECT_TRUE(ValidateAdamConfig(AdamConfig{}).ok());
}

}  // namespace
}  // namespace ckpt::worker
