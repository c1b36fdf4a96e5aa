#include "coordinator/progress_watch.h"

#include <algorithm>

namespace ckpt::coordinator {

RankBeat ProgressWatch::BeatOf(const coord::v1::RankProgress& p,
                               int64_t now_ms) {
  RankBeat b;
  b.has_step = p.has_step();
  b.step = p.step();
  b.advanced_ms = now_ms - static_cast<int64_t>(p.ms_since_advance());
  b.p99_ms = p.step_ms_p99();
  b.has_pause = p.has_pause();
  b.pause_end_ms = now_ms - static_cast<int64_t>(p.ms_since_pause()) +
                   static_cast<int64_t>(p.pause_ms());
  b.pause_reason = p.pause_reason();
  b.compute_ms = p.compute_ms();
  b.p50_ms = p.step_ms_p50();
  return b;
}

int64_t ProgressWatch::ScanMsFor(const HangPolicy& policy) {
  const double shortest_s = std::min(policy.min_s, policy.first_step_s);
  return std::clamp(static_cast<int64_t>(shortest_s * 1000 / 100), kMinScanMs,
                    kMaxScanMs);
}

bool ProgressWatch::ScanDue(int64_t now_ms) {
  if (last_scan_ms_ != INT64_MIN && now_ms - last_scan_ms_ < scan_ms_)
    return false;
  last_scan_ms_ = now_ms;
  return true;
}

}  // namespace ckpt::coordinator
