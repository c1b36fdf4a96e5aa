// ProgressWatch: the heartbeat's progress sub-protocol apart from the
// job state it feeds. A node sends each hosted rank's progress with times
// relative to the heartbeat (no clocks need to agree); BeatOf puts them on
// the coordinator's clock for the hang model (hang_model.h). The hang scan
// runs at most every ScanMsFor(policy) however many heartbeats arrive
// (ScanDue): a scan looks at every rank of every job, so at 131,072 ranks
// ten scans a second would cost a core's tenth for timeouts of minutes.
// Not thread-safe: the Coordinator keeps it under its state mutex.
#ifndef CKPT_COORDINATOR_PROGRESS_WATCH_H_
#define CKPT_COORDINATOR_PROGRESS_WATCH_H_

#include <climits>
#include <cstdint>

#include "coordinator.pb.h"
#include "coordinator/hang_model.h"

namespace ckpt::coordinator {

class ProgressWatch {
 public:
  static constexpr int64_t kMinScanMs = 100;
  static constexpr int64_t kMaxScanMs = 1000;

  // A hundredth of the policy's shortest timeout (a scan adds at most 1%
  // to a detection), within [kMinScanMs, kMaxScanMs]: 1 s for the
  // defaults (120 s, 900 s), 100 ms for timeouts of 10 s and less.
  static int64_t ScanMsFor(const HangPolicy& policy);

  explicit ProgressWatch(int64_t scan_ms = kMinScanMs) : scan_ms_(scan_ms) {}

  // `p`, heard at `now_ms`, on the coordinator's clock.
  static RankBeat BeatOf(const coord::v1::RankProgress& p, int64_t now_ms);
  // Whether a hang scan is due at `now_ms` (the first always is); if so,
  // the next one is due scan_ms() later.
  bool ScanDue(int64_t now_ms);
  int64_t scan_ms() const { return scan_ms_; }

 private:
  int64_t scan_ms_;
  int64_t last_scan_ms_ = INT64_MIN;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PROGRESS_WATCH_H_
