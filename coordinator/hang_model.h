// The one timeout model of hang detection, as pure functions of what the
// coordinator knows of a job's ranks (their nodes' beacon reports) and a
// clock value: no state, no lock, no I/O, so that it is tested alone.
//
// A rank is hung when it has not advanced for
//   timeout = max(min_s, factor x its p99 time between advances)
// counted from its last advance; in the first step after a (re)start
// (no advance seen since the generation started) the deadline is instead
// the start + first_step_s. A pause declared since the last advance
// (ExpectPause) moves the deadline once, to the pause's end + timeout.
//
// When any rank is past its deadline, the stuck ranks are named: those
// whose step is behind the others' (a rank that never reported a step is
// behind every rank that did); when every rank is at the same step, those
// whose progress stopped first (within kTieMs of the earliest), since
// the others stopped only because they wait for them.
#ifndef CKPT_COORDINATOR_HANG_MODEL_H_
#define CKPT_COORDINATOR_HANG_MODEL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ckpt::coordinator {

struct HangPolicy {
  // Defaults a user need not change (doc/operations.md says why).
  double min_s = 120;         // --hang-timeout-min-s
  double factor = 10;         // --hang-factor
  double first_step_s = 900;  // --first-step-timeout-s
  // Stragglers: a rank whose compute time (its step time where none is
  // reported) is above straggler_factor x the job's median in
  // straggler_windows consecutive windows of straggler_window_s.
  double straggler_factor = 1.5;   // --straggler-factor
  int straggler_windows = 3;       // --straggler-windows
  double straggler_window_s = 10;  // --straggler-window-s
};

// One rank as the coordinator last heard of it (coordinator clock, ms).
struct RankBeat {
  bool has_step = false;
  uint64_t step = 0;
  int64_t advanced_ms = 0;  // when the step last changed
  uint32_t p99_ms = 0;      // time between advances, over the node's window
  bool has_pause = false;   // declared since advanced_ms
  int64_t pause_end_ms = 0;
  std::string pause_reason;
  uint32_t compute_ms = 0;  // the last step's own compute; 0: not reported
  uint32_t p50_ms = 0;      // median time between advances
};

// The time a straggler is judged on: the compute time, else the median
// step time; 0 when neither is known.
inline uint32_t StragglerTimeMs(const RankBeat& b) {
  return b.compute_ms > 0 ? b.compute_ms : b.p50_ms;
}

// The ranks (of `ranks`, with a known time) whose time is above
// factor x the median of those times; empty with fewer than two known.
std::vector<uint32_t> SlowRanks(const HangPolicy& policy,
                                const std::vector<uint32_t>& ranks,
                                const std::map<uint32_t, RankBeat>& beats,
                                uint32_t* median_ms);

struct HangVerdict {
  std::vector<uint32_t> stuck;
  bool has_step = false;
  uint64_t step = 0;
  double timeout_s = 0;
  double silent_s = 0;
  bool first_step = false;
  std::string pause_reason;
  std::string detail;  // "rank 5 stopped at step 41; ranks 0-4,6-7 reached 42"
};

inline constexpr int64_t kTieMs = 250;

// The rank's timeout in seconds (not counting the first step's).
double HangTimeoutS(const HangPolicy& policy, const RankBeat& beat);
// Whether the rank has not advanced since the generation started.
bool InFirstStep(const RankBeat* beat, int64_t start_ms);
// When the rank is hung if it does not advance (coordinator ms); `beat`
// null: it never reported.
int64_t HangDeadlineMs(const HangPolicy& policy, const RankBeat* beat,
                       int64_t start_ms);

// `ranks`: every rank the model watches (a rank without a beat never
// reported). nullopt while no rank is past its deadline, or while no rank
// of the job ever reported a step (a job without beacons or saves is not
// watched).
std::optional<HangVerdict> FindHang(const HangPolicy& policy,
                                    const std::vector<uint32_t>& ranks,
                                    const std::map<uint32_t, RankBeat>& beats,
                                    int64_t start_ms, int64_t now_ms);

// "0-4,6-7".
std::string RankRanges(const std::vector<uint32_t>& ranks);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_HANG_MODEL_H_
