// The benchmarks' shared arithmetic: seconds since a steady-clock time and
// the median of samples. Pure functions; thread-safe.
#ifndef CKPT_BENCH_STATS_H_
#define CKPT_BENCH_STATS_H_

#include <algorithm>
#include <chrono>
#include <vector>

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 0 for no samples; the mean of the middle two for an even count.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2]
                      : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_STATS_H_
