#include "util/checksum.h"

#include <vector>

#include "util/hash_stream.h"

namespace ckpt {
namespace sse2 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
void StreamReset(void*);
void StreamUpdate(void*, const void*, size_t);
uint64_t StreamDigest(const void*);
}  // namespace sse2
namespace avx2 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
void StreamReset(void*);
void StreamUpdate(void*, const void*, size_t);
uint64_t StreamDigest(const void*);
}  // namespace avx2
namespace avx512 {
uint64_t Hash64(const void*, size_t);
uint64_t CopyAndHash(void*, const void*, size_t);
void StreamReset(void*);
void StreamUpdate(void*, const void*, size_t);
uint64_t StreamDigest(const void*);
}  // namespace avx512

namespace {

struct Impl {
  uint64_t (*hash)(const void*, size_t);
  uint64_t (*copy_and_hash)(void*, const void*, size_t);
  void (*stream_reset)(void*);
  void (*stream_update)(void*, const void*, size_t);
  uint64_t (*stream_digest)(const void*);
  const char* name;
};

Impl Choose() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return {avx512::Hash64,       avx512::CopyAndHash,  avx512::StreamReset,
            avx512::StreamUpdate, avx512::StreamDigest, "avx512"};
  if (__builtin_cpu_supports("avx2"))
    return {avx2::Hash64,       avx2::CopyAndHash,  avx2::StreamReset,
            avx2::StreamUpdate, avx2::StreamDigest, "avx2"};
  return {sse2::Hash64,       sse2::CopyAndHash,  sse2::StreamReset,
          sse2::StreamUpdate, sse2::StreamDigest, "sse2"};
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

void Hash64Stream::Reset() { Chosen().stream_reset(state_); }
void Hash64Stream::Update(const void* data, size_t size) {
  Chosen().stream_update(state_, data, size);
}
uint64_t Hash64Stream::Digest() const { return Chosen().stream_digest(state_); }

const char* ChecksumImplementation() { return Chosen().name; }

}  // namespace ckpt
