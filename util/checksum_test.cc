#include "util/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "util/hash_stream.h"

namespace ckpt {
namespace {

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

TEST(ChecksumTest, CopyAndHashCopiesAndMatchesHash64) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{65536},
                   size_t{65537}, size_t{kChecksumChunk}}) {
    auto src = RandomBytes(n, 7);
    std::vector<char> dst(n + 1, 0);
    uint64_t h = CopyAndHash(dst.data(), src.data(), n);
    EXPECT_EQ(h, Hash64(src.data(), n)) << n;
    if (n > 0) {
      EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), n)) << n;
    }
  }
}

TEST(ChecksumTest, FusedCopyAndHashEqualsXxh3ForEveryLengthAndAlignment) {
  auto src = RandomBytes(kChecksumChunk + 256, 21);
  std::vector<char> dst(kChecksumChunk + 512);
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 2100; ++n) sizes.push_back(n);
  for (size_t n : {4095ul, 4096ul, 4097ul, 65535ul, 65536ul, 99999ul,
                   kChecksumChunk - 1, kChecksumChunk})
    sizes.push_back(n);
  for (size_t n : sizes) {
    for (size_t dst_off : {size_t{0}, size_t{64}, size_t{3}}) {
      for (size_t src_off : {size_t{0}, size_t{5}}) {
        if (n + src_off > src.size()) continue;
        char* d = dst.data() +
                  ((64 - reinterpret_cast<uintptr_t>(dst.data()) % 64) % 64) +
                  dst_off;
        ASSERT_EQ(CopyAndHash(d, src.data() + src_off, n),
                  Hash64(src.data() + src_off, n))
            << "size " << n << " dst_off " << dst_off << " src_off " << src_off;
        if (n > 0) {
          ASSERT_EQ(0, std::memcmp(d, src.data() + src_off, n)) << n;
        }
      }
    }
  }
}

TEST(ChecksumTest, Hash64StreamEqualsHash64OfTheConcatenation) {
  auto bytes = RandomBytes(kChecksumChunk + 333, 5);
  for (size_t piece : {size_t{1}, size_t{63}, size_t{4096}, size_t{16411},
                       size_t{kChecksumChunk + 333}}) {
    Hash64Stream h;
    h.Update(bytes.data(), 7);  // discarded by the Reset
    h.Reset();
    for (size_t off = 0; off < bytes.size(); off += piece)
      h.Update(bytes.data() + off, std::min(piece, bytes.size() - off));
    EXPECT_EQ(h.Digest(), Hash64(bytes.data(), bytes.size())) << piece;
  }
  Hash64Stream empty;
  EXPECT_EQ(empty.Digest(), Hash64(nullptr, 0));
}

TEST(ChecksumTest, TensorChecksumIsCombinationOfChunkHashes) {
  const size_t n = 2 * kChecksumChunk + 12345;
  auto bytes = RandomBytes(n, 3);
  std::vector<uint64_t> chunks;
  for (size_t off = 0; off < n; off += kChecksumChunk)
    chunks.push_back(
        Hash64(bytes.data() + off, std::min<size_t>(kChecksumChunk, n - off)));
  EXPECT_EQ(chunks.size(), ChecksumChunks(n));
  EXPECT_EQ(TensorChecksum(bytes.data(), n), CombineChunkHashes(chunks));
}

TEST(ChecksumTest, SingleBitFlipChangesTensorChecksum) {
  auto bytes = RandomBytes(kChecksumChunk + 100, 11);
  uint64_t before = TensorChecksum(bytes.data(), bytes.size());
  bytes[kChecksumChunk + 50] ^= 0x10;
  EXPECT_NE(before, TensorChecksum(bytes.data(), bytes.size()));
}

TEST(ChecksumTest, KnownValueOfXxh3) {
  // XXH3-64 of the empty input with seed 0 (from the xxHash specification).
  EXPECT_EQ(Hash64("", 0), 0x2D06800538D394C2ull);
  EXPECT_NE(ChecksumImplementation(), nullptr);
}

}  // namespace
}  // namespace ckpt
