// Checksums of tensor bytes: XXH3-64, dispatched at run time to the widest
// vector unit the CPU has (AVX-512, AVX2, else SSE2).
//
// A tensor's checksum is defined chunk-wise so that several threads can
// compute it while they copy: the bytes are cut into kChecksumChunk-byte
// chunks (the last may be shorter; an empty tensor has no chunk), each chunk
// is hashed with XXH3-64 (seed 0), and the tensor's checksum is XXH3-64 of
// the little-endian array of chunk hashes. See doc/shard-format.md.
// All functions are pure and thread-safe.
#ifndef CKPT_UTIL_CHECKSUM_H_
#define CKPT_UTIL_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace ckpt {

inline constexpr uint64_t kChecksumChunk = 1 << 20;

// XXH3-64 of [data, data+size).
uint64_t Hash64(const void* data, size_t size);
// Number of chunks a tensor of `bytes` bytes has.
inline uint64_t ChecksumChunks(uint64_t bytes) {
  return (bytes + kChecksumChunk - 1) / kChecksumChunk;
}
// Combines the per-chunk hashes of a tensor into its checksum.
uint64_t CombineChunkHashes(std::span<const uint64_t> chunk_hashes);
// The checksum of a whole tensor, single-threaded (verification, tools).
uint64_t TensorChecksum(const void* data, size_t size);
// memcpy(dst, src, size) followed by Hash64 of the copied bytes, done in
// cache-sized pieces so the hash reads bytes the copy just brought in.
// size must be at most kChecksumChunk.
uint64_t CopyAndHash(void* dst, const void* src, size_t size);
// Name of the implementation chosen on this CPU ("avx512", "avx2", "sse2").
const char* ChecksumImplementation();

}  // namespace ckpt

#endif  // CKPT_UTIL_CHECKSUM_H_
