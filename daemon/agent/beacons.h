// BeaconMonitor: ckptd's poll of the progress beacons of the ranks it hosts
// (shm/beacon.h), turned into what the coordinator's hang and straggler
// detection needs per rank: the step, how long ago it last changed, the
// step time (median and p99 over a window) and the last compute time,
// and the first pause declared since the last advance. "Step time" is
// the time between the advances a poll sees (polls every 100 ms).
//
// It maps each hosted rank's arena by name (read-only, two pages) on its
// own: the engine is never asked or locked, and an arena that does not
// exist yet (the rank has neither saved nor restored) is tried again. A
// save counts as progress: the newest step the daemon staged in the
// rank's slots advances the rank like a beacon does. Every time is this
// process's steady clock, taken when the poll saw the change: nothing the
// trainer writes is used as a time.
//
// Thread-safety: every method is safe to call concurrently; Start() runs
// the poll on a thread of its own until destruction.
#ifndef CKPT_DAEMON_AGENT_BEACONS_H_
#define CKPT_DAEMON_AGENT_BEACONS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coordinator.pb.h"
#include "shm/beacon.h"

namespace ckpt::daemon {

struct BeaconMonitorOptions {
  std::string shm_prefix;  // arenas are "/<prefix>.<job>.r<rank>"
  std::string huge_dir;    // or "<huge_dir>/<prefix>..." (EngineOptions)
  std::chrono::milliseconds poll{100};
  size_t window = 200;  // step times kept per rank
  // How often a missing or replaced arena is looked for again.
  std::chrono::milliseconds reopen{1000};
};

class BeaconMonitor {
 public:
  using Clock = std::chrono::steady_clock;
  explicit BeaconMonitor(BeaconMonitorOptions options);
  ~BeaconMonitor();

  void Start();
  // The ranks to watch (the node's placement); others are forgotten.
  void SetHosted(const std::map<std::string, std::vector<uint32_t>>& hosted);
  // One poll of every hosted rank as of `now` (the thread's body; tests
  // call it with their own times).
  void PollOnce(Clock::time_point now);
  // Every watched rank's progress as of `now`.
  std::vector<coord::v1::RankProgress> Snapshot(Clock::time_point now);

 private:
  struct Rank {
    std::shared_ptr<shm::BeaconView> view;
    Clock::time_point next_open{};
    std::optional<int64_t> beacon_step;
    std::optional<uint64_t> slot_step;
    std::optional<Clock::time_point> advanced;  // when the step last changed
    std::deque<double> step_ms;                 // the window
    uint64_t compute_ns = 0;
    uint64_t pause_count = 0;
    bool pause_seen = false;  // pause_count read once (a baseline)
    struct Pause {
      Clock::time_point at;
      uint64_t ms = 0;
      std::string reason;
    };
    std::optional<Pause> pause;  // the first since the last advance
  };
  void PollRank(Rank& rank, Clock::time_point now);
  // The step changed at `now`; `timed`: forwards, a time sample.
  void Advance(Rank& rank, Clock::time_point now, bool timed);
  void Loop();

  const BeaconMonitorOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::pair<std::string, uint32_t>, Rank> ranks_;
  std::thread thread_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_BEACONS_H_
