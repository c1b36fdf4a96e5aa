#include "util/checksum.h"

#include <vector>

namespace ckpt {
namespace sse2 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
}  // namespace sse2
namespace avx2 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
}  // namespace avx2
namespace avx512 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
}  // namespace avx512

namespace {

struct Impl {
  uint64_t (*hash)(const void*, size_t);
  uint64_t (*copy_and_hash)(void*, const void*, size_t);
  const char* name;
};

Impl Choose() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return {avx512::Hash64, avx512::CopyAndHash, "avx512"};
  if (__builtin_cpu_supports("avx2"))
    return {avx2::Hash64, avx2::CopyAndHash, "avx2"};
  return {sse2::Hash64, sse2::CopyAndHash, "sse2"};
}

const Impl& Chosen() {
  static const Impl impl = Choose();
  return impl;
}

}  // namespace

uint64_t Hash64(const void* data, size_t size) {
  return Chosen().hash(data, size);
}

uint64_t CopyAndHash(void* dst, const void* src, size_t size) {
  return Chosen().copy_and_hash(dst, src, size);
}

uint64_t CombineChunkHashes(std::span<const uint64_t> chunk_hashes) {
  // x86-64 is little-endian, which is the format's byte order.
  return Hash64(chunk_hashes.data(), chunk_hashes.size() * sizeof(uint64_t));
}

uint64_t TensorChecksum(const void* data, size_t size) {
  std::vector<uint64_t> chunks(ChecksumChunks(size));
  const auto* p = static_cast<const char*>(data);
  for (size_t i = 0; i < chunks.size(); ++i) {
    size_t off = i * kChecksumChunk;
    size_t n = size - off < kChecksumChunk ? size - off : kChecksumChunk;
    chunks[i] = Hash64(p + off, n);
  }
  return CombineChunkHashes(chunks);
}

const char* ChecksumImplementation() { return Chosen().name; }

}  // namespace ckpt
