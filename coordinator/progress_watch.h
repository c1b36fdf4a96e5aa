// ProgressWatch: the heartbeat's progress sub-protocol apart from the
// job state it feeds. A node sends each hosted rank's progress with times
// relative to the heartbeat (no clocks need to agree); BeatOf puts them on
// the coordinator's clock for the hang model (hang_model.h). The hang scan
// runs at most every kScanMs however many heartbeats arrive (ScanDue).
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
  static constexpr int64_t kScanMs = 100;

  // `p`, heard at `now_ms`, on the coordinator's clock.
  static RankBeat BeatOf(const coord::v1::RankProgress& p, int64_t now_ms);
  // Whether a hang scan is due at `now_ms` (the first always is); if so,
  // the next one is due kScanMs later.
  bool ScanDue(int64_t now_ms);

 private:
  int64_t last_scan_ms_ = INT64_MIN;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_PROGRESS_WATCH_H_
