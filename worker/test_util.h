// Helpers shared by the optimizer tests: deterministic random fp32 data and a
// bitwise comparison of float arrays. Not part of the library.
#ifndef CKPT_WORKER_TEST_UTIL_H_
#define CKPT_WORKER_TEST_UTIL_H_

#include <cstring>
#include <random>
#include <vector>

namespace ckpt::worker::testing {

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo,
                                       float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

}  // namespace ckpt::worker::testing

#endif  // CKPT_WORKER_TEST_UTIL_H_
