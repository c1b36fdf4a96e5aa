#include "client/copy_engine.h"

#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "util/checksum.h"

namespace ckpt::client {
namespace {

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

// Copies regions of the given sizes with `threads` and checks bytes and
// checksums against the single-threaded definition.
void CheckCopy(int threads, const std::vector<size_t>& sizes) {
  CopyEngine engine(threads);
  ASSERT_EQ(engine.threads(), threads);
  std::vector<std::vector<char>> src, dst;
  std::vector<CopyRegion> regions;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(RandomBytes(sizes[i], static_cast<uint32_t>(i + 1)));
    dst.emplace_back(sizes[i], '\x7f');
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    regions.push_back({src[i].data(), dst[i].data(), sizes[i]});
  std::vector<uint64_t> sums(sizes.size());
  engine.Run(regions, sums);
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE("region " + std::to_string(i) + " of " +
                 std::to_string(sizes[i]) + " bytes");
    EXPECT_EQ(sums[i], TensorChecksum(src[i].data(), sizes[i]));
    EXPECT_TRUE(dst[i] == src[i]);
  }
}

TEST(CopyEngineTest, ChecksumsEqualTensorChecksumForOddSizes) {
  const std::vector<size_t> sizes = {1,
                                     7,
                                     4095,
                                     kChecksumChunk - 1,
                                     kChecksumChunk,
                                     kChecksumChunk + 1,
                                     3 * kChecksumChunk + 12345};
  for (int threads = 1; threads <= 4; ++threads) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    CheckCopy(threads, sizes);
  }
}

TEST(CopyEngineTest, EmptyRegionsGetTheEmptyChecksum) {
  for (int threads = 1; threads <= 4; ++threads)
    CheckCopy(threads, {0, 5 << 20, 0, 3, 0});
}

TEST(CopyEngineTest, ManySmallRegions) {
  std::vector<size_t> sizes;
  for (size_t i = 0; i < 3000; ++i) sizes.push_back(1 + (i * 37) % 5000);
  for (int threads = 1; threads <= 4; ++threads) CheckCopy(threads, sizes);
}

TEST(CopyEngineTest, NullDestinationOnlyHashes) {
  CopyEngine engine(3);
  auto src = RandomBytes(4 * kChecksumChunk + 9, 42);
  CopyRegion r{src.data(), nullptr, src.size()};
  uint64_t sum = 0;
  engine.Run({&r, 1}, {&sum, 1});
  EXPECT_EQ(sum, TensorChecksum(src.data(), src.size()));
}

TEST(CopyEngineTest, RepeatedRunsReuseThePool) {
  CopyEngine engine(4);
  for (int round = 0; round < 50; ++round) {
    auto src =
        RandomBytes(2 * kChecksumChunk + static_cast<size_t>(round), round);
    std::vector<char> dst(src.size());
    CopyRegion r{src.data(), dst.data(), src.size()};
    uint64_t sum = 0;
    engine.Run({&r, 1}, {&sum, 1});
    ASSERT_EQ(sum, TensorChecksum(src.data(), src.size())) << round;
    ASSERT_TRUE(dst == src) << round;
  }
}

TEST(CopyEngineTest, ZeroThreadsMeansOnePerCpu) {
  CopyEngine engine(0);
  EXPECT_GE(engine.threads(), 1);
  CheckCopy(engine.threads(), {kChecksumChunk * 3 + 1});
}

}  // namespace
}  // namespace ckpt::client
