// Hash64Stream: util/checksum.h's Hash64 (XXH3-64) of bytes fed in pieces.
// Thread-compatible (one object per thread).
#ifndef CKPT_UTIL_HASH_STREAM_H_
#define CKPT_UTIL_HASH_STREAM_H_

#include <cstddef>
#include <cstdint>

namespace ckpt {

// Digest() equals Hash64 of everything Update() was given since the last
// Reset() (or construction). For bytes seen once in passing (a network
// receive), hashed while they are still in cache.
class Hash64Stream {
 public:
  static constexpr size_t kStateBytes = 640;
  static constexpr size_t kStateAlign = 64;
  Hash64Stream() { Reset(); }
  void Reset();
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  alignas(kStateAlign) unsigned char state_[kStateBytes];
};

}  // namespace ckpt

#endif  // CKPT_UTIL_HASH_STREAM_H_
