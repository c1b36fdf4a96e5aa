// recovery_bench's summary of the restart rounds (bench/restart_bench.h):
// medians of the warm rounds (every ckptrun --warm 1, a node loss after
// the trainer kill) beside the limits measured in the same run: the job's
// step, the cold rounds' replacement (--warm 0) and the heartbeat timeout.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/restart_bench.h"
#include "bench/stats.h"

namespace ckpt::bench {
namespace {

// The targets for the C++ worker, printed beside the figures.
constexpr double kInProcessTargetS = 0.150;
constexpr double kPeerDetectTargetS = 0.5;
constexpr double kNodeLossTargetS = 1.5;

template <typename F>
double RoundsMedian(const std::vector<RestartFigures>& rounds, F field) {
  std::vector<double> v;
  for (const auto& r : rounds) v.push_back(static_cast<double>(field(r)));
  return Median(v);
}

template <typename F>
std::string RoundsEach(const std::vector<RestartFigures>& rounds, F field) {
  std::vector<std::string> v;
  for (const auto& r : rounds)
    v.push_back(absl::StrFormat("%.3f", static_cast<double>(field(r))));
  return absl::StrJoin(v, " ");
}

struct RestartSummary {
  double step_s = 0, inprocess_s = 0, warm_s = 0, cold_s = 0, detect_s = 0,
         suspected_s = 0, node_s = 0, load = 0, heartbeat_s = 0;
  int kept = 0, survivors = 0, placed = 0, node_kept = 0, by_probe = 0;
  int plans = 0, failures = 0;
  double plans_per_failure() const {
    return failures > 0 ? static_cast<double>(plans) / failures : 0;
  }
};

RestartSummary SummarizeRestarts(const std::vector<RestartFigures>& warm,
                                 const std::vector<RestartFigures>& cold,
                                 int heartbeat_ms) {
  RestartSummary s;
  s.step_s = RoundsMedian(warm, [](auto& f) { return f.step_s; });
  s.inprocess_s = RoundsMedian(warm, [](auto& f) { return f.survivors_s; });
  s.warm_s = RoundsMedian(warm, [](auto& f) { return f.replacement_s; });
  s.cold_s = RoundsMedian(cold, [](auto& f) { return f.replacement_s; });
  s.detect_s = RoundsMedian(warm, [](auto& f) { return f.detect_s; });
  s.suspected_s = RoundsMedian(warm, [](auto& f) { return f.suspected_s; });
  s.node_s = RoundsMedian(warm, [](auto& f) { return f.node_first_step_s; });
  std::vector<double> loads;
  for (const auto* side : {&warm, &cold})
    for (const auto& f : *side) {
      loads.push_back(f.load_1m);
      if (f.failures > 1) loads.push_back(f.node_load_1m);
      s.plans += f.plans;
      s.failures += f.failures;
    }
  s.load = Median(loads);
  for (const auto& f : warm) {
    s.kept += f.kept;
    s.survivors += f.survivors;
    s.placed += f.replacement_warm;
    s.node_kept += f.node_kept;
    s.by_probe += f.detected_by_probe;
  }
  s.heartbeat_s = heartbeat_ms / 1e3;
  return s;
}

}  // namespace

std::string RestartJsonFields(const std::vector<RestartFigures>& warm,
                              const std::vector<RestartFigures>& cold,
                              int heartbeat_ms) {
  const RestartSummary s = SummarizeRestarts(warm, cold, heartbeat_ms);
  std::string j;
  auto num = [&](const char* key, double v, int digits = 3) {
    absl::StrAppend(&j, j.empty() ? "" : ",", "\"", key,
                    "\":", absl::StrFormat("%.*f", digits, v));
  };
  num("inprocess_restart_s", s.inprocess_s);
  num("inprocess_restart_step_s", s.step_s, 4);  // the job's own step
  num("inprocess_restart_target_s", kInProcessTargetS);
  num("survivors_kept", s.kept, 0);
  num("survivors", s.survivors, 0);
  num("warm_replacement_s", s.warm_s);
  num("cold_replacement_s", s.cold_s);  // the same kill, --warm 0
  num("warm_placed", s.placed, 0);
  num("peer_detect_s", s.detect_s);
  num("peer_suspected_s", s.suspected_s);
  num("peer_detect_by_probe", s.by_probe, 0);
  num("heartbeat_timeout_s", s.heartbeat_s);  // detection without peers
  num("peer_detect_target_s", kPeerDetectTargetS);
  num("node_loss_first_step_s", s.node_s);
  num("node_loss_survivors_kept", s.node_kept, 0);
  num("plans_per_failure", s.plans_per_failure());
  num("plans", s.plans, 0);
  num("failures", s.failures, 0);
  num("restart_rounds", static_cast<double>(warm.size()), 0);
  num("restart_load_1m", s.load, 2);
  return j;
}

std::string RestartText(const std::vector<RestartFigures>& warm,
                        const std::vector<RestartFigures>& cold,
                        int heartbeat_ms) {
  if (warm.empty() && cold.empty()) return "";
  const RestartSummary s = SummarizeRestarts(warm, cold, heartbeat_ms);
  std::string t = absl::StrFormat(
      "restart (ckpt-worker, 2 nodes x 2 ranks + spare, small state; %zu "
      "rounds with --warm 1 and a node loss, %zu with --warm 0; load %.2f):\n",
      warm.size(), cold.size(), s.load);
  auto row = [&](const std::string& what, double v, const std::string& beside,
                 const std::string& rounds) {
    absl::StrAppend(&t, absl::StrFormat("  %-46s %7.3f s  %s; rounds: %s\n",
                                        what, v, beside, rounds));
  };
  row("trainer killed -> survivors' first step", s.inprocess_s,
      absl::StrFormat("step %.4f s, target %.3f s, kept %d of %d", s.step_s,
                      kInProcessTargetS, s.kept, s.survivors),
      RoundsEach(warm, [](auto& f) { return f.survivors_s; }));
  row("trainer killed -> replacement's first step", s.warm_s,
      absl::StrFormat("cold (--warm 0) %.3f s, warm placed %d of %zu", s.cold_s,
                      s.placed, warm.size()),
      RoundsEach(warm, [](auto& f) { return f.replacement_s; }));
  row("node killed -> declared dead (from peers)", s.detect_s,
      absl::StrFormat("heartbeat timeout %.3f s, target %.3f s, by probe %d "
                      "of %zu, first peer report %.3f s",
                      s.heartbeat_s, kPeerDetectTargetS, s.by_probe,
                      warm.size(), s.suspected_s),
      RoundsEach(warm, [](auto& f) { return f.detect_s; }));
  row("node killed -> every rank's first step", s.node_s,
      absl::StrFormat("target %.3f s, survivors kept %d of %zu",
                      kNodeLossTargetS, s.node_kept, 2 * warm.size()),
      RoundsEach(warm, [](auto& f) { return f.node_first_step_s; }));
  absl::StrAppend(&t,
                  absl::StrFormat("  plans per failure %.2f (%d plans, %d "
                                  "failures; target 1)\n",
                                  s.plans_per_failure(), s.plans, s.failures));
  return t;
}

}  // namespace ckpt::bench
