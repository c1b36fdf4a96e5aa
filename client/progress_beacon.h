// ProgressBeacon: a rank's progress beacon as libckpt keeps it. Progress()
// and ExpectPause() store into the beacon page of the rank's arena
// (shm/beacon.h): no system call, no RPC. Until the arena is mapped (the
// first save or restore registers it) the values wait here and are written
// when it is; an arena the daemon replaced (it grew) gets a new mapping,
// and the old one is kept (one page) so that a concurrent Progress never
// touches unmapped memory.
//
// Thread-safety: Progress and ExpectPause from one thread at a time (the
// training loop); Attach from any thread, concurrently with them.
#ifndef CKPT_CLIENT_PROGRESS_BEACON_H_
#define CKPT_CLIENT_PROGRESS_BEACON_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "shm/beacon.h"

namespace ckpt::client {

class ProgressBeacon {
 public:
  void Progress(int64_t step, uint64_t compute_ns) {
    shm::BeaconWriter* w = writer_.load(std::memory_order_acquire);
    if (w != nullptr) {
      w->Progress(step, compute_ns);
      return;
    }
    ProgressSlow(step, compute_ns);
  }
  void ExpectPause(uint64_t pause_ms, const std::string& reason);
  // The arena `name` (segment identity dev/ino) is mapped: write the
  // beacon there from now on. A failure is logged and changes nothing.
  void Attach(const std::string& name, dev_t dev, ino_t ino);

 private:
  void ProgressSlow(int64_t step, uint64_t compute_ns);

  std::atomic<shm::BeaconWriter*> writer_{nullptr};
  std::mutex mu_;                                            // the fields below
  std::vector<std::unique_ptr<shm::BeaconWriter>> writers_;  // newest last
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::optional<std::pair<int64_t, uint64_t>> pending_progress_;
  std::optional<std::pair<uint64_t, std::string>> pending_pause_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_PROGRESS_BEACON_H_
