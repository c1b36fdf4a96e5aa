// Synthetic next-token data with learnable structure. The seed fixes a few
// affine patterns token' = (a * token + b) mod vocab; each sequence picks one
// pattern and a first token, and each following token obeys the pattern
// except with probability `noise`, when it is uniform. A batch is a pure
// function of (seed, step, rank), so the data position of a run is its step
// and a resumed run sees exactly the batches an uninterrupted one would.
// Pure functions; thread-safe.
#ifndef CKPT_WORKER_SYNTHETIC_DATA_H_
#define CKPT_WORKER_SYNTHETIC_DATA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt::worker {

struct SyntheticData {
  int vocab = 256;
  int seq = 32;    // tokens per sequence = seq + 1
  int batch = 16;  // sequences per batch
  uint64_t seed = 1;
  int patterns = 4;
  float noise = 0.05f;
};

// batch sequences of seq + 1 tokens, row after row, each in [0, vocab).
std::vector<int32_t> MakeBatch(const SyntheticData& data, int64_t step,
                               int rank);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SYNTHETIC_DATA_H_
