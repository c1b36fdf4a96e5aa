#include "worker/synthetic_data.h"

#include "worker/splitmix.h"

namespace ckpt::worker {

std::vector<int32_t> MakeBatch(const SyntheticData& data, int64_t step,
                               int rank) {
  const uint32_t vocab = static_cast<uint32_t>(data.vocab);
  const int patterns = data.patterns < 1 ? 1 : data.patterns;
  std::vector<uint32_t> mul(patterns), add(patterns);
  SplitMix64 pattern_rng(data.seed ^ 0x5EED5EED5EED5EEDull);
  for (int k = 0; k < patterns; ++k) {
    mul[k] = 1 + pattern_rng.Below(vocab - 1);
    add[k] = pattern_rng.Below(vocab);
  }
  // One independent stream per (seed, step, rank).
  SplitMix64 mix(data.seed);
  uint64_t key = mix.Next() ^
                 (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ull) ^
                 (static_cast<uint64_t>(rank) * 0xABC98388FB8FAC03ull);
  SplitMix64 rng(key);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(data.batch) * (data.seq + 1));
  for (int b = 0; b < data.batch; ++b) {
    int k = static_cast<int>(rng.Below(patterns));
    uint32_t token = rng.Below(vocab);
    out.push_back(static_cast<int32_t>(token));
    for (int t = 0; t < data.seq; ++t) {
      if (rng.NextFloat() < data.noise) {
        token = rng.Below(vocab);
      } else {
        token =
            static_cast<uint32_t>((uint64_t{mul[k]} * token + add[k]) % vocab);
      }
      out.push_back(static_cast<int32_t>(token));
    }
  }
  return out;
}

}  // namespace ckpt::worker
