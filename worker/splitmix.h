// SplitMix64: a tiny, fast, seedable 64-bit generator whose sequence is fixed
// by its seed on every platform, for initial weights and synthetic data.
// Not thread-safe; copyable (the copy continues the same sequence).
#ifndef CKPT_WORKER_SPLITMIX_H_
#define CKPT_WORKER_SPLITMIX_H_

#include <cstdint>

namespace ckpt::worker {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}

  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 24 random bits.
  float NextFloat() {
    return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f);
  }
  // Uniform in [0, n) for n > 0 (modulo bias is irrelevant here).
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(Next() % n); }

 private:
  uint64_t state_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SPLITMIX_H_
