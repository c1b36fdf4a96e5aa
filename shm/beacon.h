// Progress beacons: one page of each rank's arena that the trainer writes
// and ckptd reads, so that a hung rank can be told from a slow one without
// a system call or an RPC on the training path.
//
// Layout: the page at kBeaconOffset (the second page of the arena's 2 MiB
// header region, which older daemons reserve and zero but never use: an
// arena of an older daemon simply shows no beacon, and an older client
// never writes one). The header page stays read-only for the trainer; this
// page alone is mapped writable (BeaconWriter).
//
// Protocol: a seqlock with one writer. The writer makes `seq` odd, stores
// the fields, and makes it even again; a reader copies the fields between
// two equal even reads of `seq`. The daemon trusts nothing it reads here
// (a trainer may write anything): ReadBeacon checks every field and
// returns nullopt for a page that is torn, never written or out of range.
//
// Thread-safety: BeaconWriter's methods must not run concurrently with
// each other (one training thread calls them); ReadBeacon may run at any
// time from another process.
#ifndef CKPT_SHM_BEACON_H_
#define CKPT_SHM_BEACON_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "util/truncation_guard.h"

namespace ckpt::shm {

inline constexpr uint64_t kBeaconOffset = 4096;
inline constexpr size_t kPauseReasonWords = 16;  // 128 bytes
inline constexpr size_t kMaxPauseReasonBytes = kPauseReasonWords * 8 - 1;
// The longest pause a trainer may declare (a day): anything longer is
// treated as garbage, not as a reason never to detect a hang.
inline constexpr uint64_t kMaxPauseMs = 24ull * 3600 * 1000;

struct alignas(64) BeaconPage {
  std::atomic<uint64_t> seq;             // even: stable; odd: being written
  std::atomic<int64_t> step;             // the last step reported
  std::atomic<uint64_t> progress_count;  // Progress calls; 0: never called
  std::atomic<uint64_t> compute_ns;      // of the last step; 0: not reported
  std::atomic<uint64_t> pause_count;     // ExpectPause calls
  std::atomic<uint64_t> pause_ms;        // of the last ExpectPause
  std::atomic<uint64_t> pause_reason[kPauseReasonWords];  // NUL-padded
  std::atomic<uint32_t> pid;  // the writer's pid (informational)
};
static_assert(sizeof(BeaconPage) <= 4096);
static_assert(std::atomic<int64_t>::is_always_lock_free);

// What a reader saw, checked.
struct BeaconSnapshot {
  int64_t step = 0;
  uint64_t progress_count = 0;
  uint64_t compute_ns = 0;
  uint64_t pause_count = 0;
  uint64_t pause_ms = 0;
  std::string pause_reason;  // printable ASCII only
  uint32_t pid = 0;
};

// Reads `page` (seqlock, a few tries); nullopt if never written, torn on
// every try, or holding a value out of range (a negative step, a compute
// time over an hour, a pause over kMaxPauseMs).
std::optional<BeaconSnapshot> ReadBeacon(const BeaconPage& page);

// The daemon's read-only mapping of an arena's header and beacon pages
// (the first two pages), for polling without the engine.
class BeaconView {
 public:
  ~BeaconView();
  // Maps arena `name` and checks its header names `job` and `rank`;
  // NotFound if there is no such segment, DataLoss naming the field if its
  // header does not match.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BeaconView>> Open(
      std::string_view name, std::string_view job, uint32_t rank);
  // Whether the segment under the name is still the one mapped (an arena
  // that grew was replaced by a new one).
  bool IsCurrent() const;
  std::optional<BeaconSnapshot> Read() const;
  // The newest step the daemon staged in a slot (it alone writes the slot
  // table, so this one is trusted); nullopt if none.
  std::optional<uint64_t> NewestSlotStep() const;
  const std::string& name() const { return name_; }

 private:
  BeaconView() = default;
  std::string name_;
  const char* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  // The job's uid may truncate the segment: a poll then reads zeros (no
  // beacon) instead of killing the daemon.
  TruncationGuard guard_;
  uint64_t dev_ = 0, ino_ = 0;
};

// The trainer's writable mapping of one arena's beacon page.
class BeaconWriter {
 public:
  ~BeaconWriter();
  // Maps the beacon page of arena `name` read-write.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BeaconWriter>> Open(
      std::string_view name);

  // A store into shared memory: no system call.
  void Progress(int64_t step, uint64_t compute_ns) {
    const uint64_t s = page_->seq.load(std::memory_order_relaxed);
    page_->seq.store(s + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    page_->step.store(step, std::memory_order_relaxed);
    page_->compute_ns.store(compute_ns, std::memory_order_relaxed);
    page_->progress_count.store(++count_, std::memory_order_relaxed);
    page_->seq.store(s + 2, std::memory_order_release);
  }
  // Declares that the next `pause_ms` may show no progress (evaluation, a
  // long save); `reason` is cut to kMaxPauseReasonBytes.
  void ExpectPause(uint64_t pause_ms, std::string_view reason);
  const std::string& name() const { return name_; }

 private:
  BeaconWriter() = default;
  std::string name_;
  char* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  BeaconPage* page_ = nullptr;
  uint64_t count_ = 0;
  uint64_t pauses_ = 0;
};

}  // namespace ckpt::shm

#endif  // CKPT_SHM_BEACON_H_
