#include "worker/cpu_adam.h"

#include <algorithm>

namespace ckpt::worker {

void AdamKernelScalar(const AdamStepScalars& s, const AdamSpan& span) {
  for (size_t i = 0; i < span.n; ++i) {
    AdamElement(s, span.p[i], span.g[i], span.m[i], span.v[i]);
    if (span.p_bf16 != nullptr) span.p_bf16[i] = FloatToBf16(span.p[i]);
  }
}

namespace {

struct Choice {
  AdamKernel kernel;
  const char* name;
};

const Choice& Chosen() {
  static const Choice choice = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
      return Choice{avx512::AdamKernel, "avx512"};
    if (__builtin_cpu_supports("avx2")) return Choice{avx2::AdamKernel, "avx2"};
    return Choice{AdamKernelScalar, "scalar"};
  }();
  return choice;
}

}  // namespace

AdamKernel BestAdamKernel() { return Chosen().kernel; }
const char* BestAdamKernelName() { return Chosen().name; }

CpuAdam::CpuAdam(int threads, AdamKernel kernel)
    : threads_(std::max(threads, 1)),
      kernel_(kernel != nullptr ? kernel : BestAdamKernel()) {
  for (int i = 1; i < threads_; ++i)
    workers_.emplace_back([this, i] { WorkerLoop(i); });
}

CpuAdam::~CpuAdam() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void CpuAdam::RunShare(int index) {
  size_t begin = static_cast<size_t>(index) * block_;
  if (begin >= n_) return;
  size_t end = std::min(n_, begin + block_);
  (*fn_)(begin, end);
}

void CpuAdam::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunShare(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void CpuAdam::ParallelFor(size_t n,
                          const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  size_t per_thread = (n + threads_ - 1) / threads_;
  size_t block = (per_thread + kGrain - 1) / kGrain * kGrain;
  if (threads_ == 1 || n <= kGrain) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    n_ = n;
    block_ = block;
    fn_ = &fn;
    pending_ = threads_ - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  RunShare(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

void CpuAdam::Update(const AdamStepScalars& s, const AdamSpan& span) {
  std::function<void(size_t, size_t)> fn = [&](size_t begin, size_t end) {
    AdamSpan part{span.p + begin,
                  span.g + begin,
                  span.m + begin,
                  span.v + begin,
                  span.p_bf16 != nullptr ? span.p_bf16 + begin : nullptr,
                  end - begin};
    kernel_(s, part);
  };
  ParallelFor(span.n, fn);
}

}  // namespace ckpt::worker
