// Multi-threaded SIMD AdamW over fp32 arrays in host memory. The kernel is
// chosen once at run time (AVX-512, AVX2, or scalar) and every variant
// evaluates AdamElement's exact operation order, with a scalar loop for the
// tail that does not fill a vector. The update is element-wise, so splitting a
// span across any number of threads gives bit-identical results.
// CpuAdam owns a fixed pool of threads; Update and ParallelFor block until all
// threads are done. One CpuAdam must be driven by one thread at a time.
#ifndef CKPT_WORKER_CPU_ADAM_H_
#define CKPT_WORKER_CPU_ADAM_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/adam_math.h"

namespace ckpt::worker {

// One contiguous run of parameters and their state. p_bf16 may be null; when
// set, the kernel also writes the updated parameters rounded to bf16 there.
struct AdamSpan {
  float* p = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* p_bf16 = nullptr;
  size_t n = 0;
};

using AdamKernel = void (*)(const AdamStepScalars& s, const AdamSpan& span);

void AdamKernelScalar(const AdamStepScalars& s, const AdamSpan& span);
namespace avx2 {
void AdamKernel(const AdamStepScalars& s, const AdamSpan& span);
}
namespace avx512 {
void AdamKernel(const AdamStepScalars& s, const AdamSpan& span);
}

// The fastest kernel this CPU supports, and its name ("avx512", "avx2",
// "scalar").
AdamKernel BestAdamKernel();
const char* BestAdamKernelName();

class CpuAdam {
 public:
  // threads >= 1 (values below are treated as 1); kernel null = BestAdamKernel.
  explicit CpuAdam(int threads, AdamKernel kernel = nullptr);
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  int threads() const { return threads_; }

  void Update(const AdamStepScalars& s, const AdamSpan& span);

  // Calls fn(begin, end) on disjoint ranges covering [0, n), one per thread,
  // each range's begin a multiple of kGrain. Used by Update and by the bench's
  // streaming roofline so that both partition memory the same way.
  void ParallelFor(size_t n, const std::function<void(size_t, size_t)>& fn);

  static constexpr size_t kGrain = 64;  // elements: 4 cache lines of fp32

 private:
  void WorkerLoop(int index);
  void RunShare(int index);

  const int threads_;
  const AdamKernel kernel_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  int pending_ = 0;          // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  size_t n_ = 0;
  size_t block_ = 0;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_CPU_ADAM_H_
