#include "coordinator/hang_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt::coordinator {

double HangTimeoutS(const HangPolicy& policy, const RankBeat& beat) {
  return std::max(policy.min_s, policy.factor * beat.p99_ms / 1000.0);
}

bool InFirstStep(const RankBeat* beat, int64_t start_ms) {
  return beat == nullptr || !beat->has_step || beat->advanced_ms <= start_ms;
}

int64_t HangDeadlineMs(const HangPolicy& policy, const RankBeat* beat,
                       int64_t start_ms) {
  const bool first = InFirstStep(beat, start_ms);
  const double timeout_s =
      first ? policy.first_step_s : HangTimeoutS(policy, *beat);
  const int64_t timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  int64_t deadline = (first ? start_ms : beat->advanced_ms) + timeout_ms;
  if (beat != nullptr && beat->has_pause)
    deadline = std::max(deadline, beat->pause_end_ms + timeout_ms);
  return deadline;
}

std::vector<uint32_t> SlowRanks(const HangPolicy& policy,
                                const std::vector<uint32_t>& ranks,
                                const std::map<uint32_t, RankBeat>& beats,
                                uint32_t* median_ms) {
  std::vector<std::pair<uint32_t, uint32_t>> known;  // (time, rank)
  for (uint32_t r : ranks) {
    auto it = beats.find(r);
    if (it != beats.end() && StragglerTimeMs(it->second) > 0)
      known.emplace_back(StragglerTimeMs(it->second), r);
  }
  *median_ms = 0;
  if (known.size() < 2) return {};
  std::vector<uint32_t> times;
  for (const auto& [t, r] : known) times.push_back(t);
  std::sort(times.begin(), times.end());
  // The lower median: with two ranks, the faster one is the reference.
  *median_ms = times[(times.size() - 1) / 2];
  std::vector<uint32_t> slow;
  for (const auto& [t, r] : known)
    if (t > policy.straggler_factor * *median_ms) slow.push_back(r);
  return slow;
}

std::string RankRanges(const std::vector<uint32_t>& ranks) {
  std::vector<uint32_t> r = ranks;
  std::sort(r.begin(), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", r[i]);
    if (j > i) absl::StrAppend(&out, "-", r[j]);
    i = j + 1;
  }
  return out;
}

std::optional<HangVerdict> FindHang(const HangPolicy& policy,
                                    const std::vector<uint32_t>& ranks,
                                    const std::map<uint32_t, RankBeat>& beats,
                                    int64_t start_ms, int64_t now_ms) {
  auto beat_of = [&](uint32_t r) -> const RankBeat* {
    auto it = beats.find(r);
    return it == beats.end() ? nullptr : &it->second;
  };
  bool any_step = false, overdue = false;
  for (uint32_t r : ranks) {
    const RankBeat* b = beat_of(r);
    any_step |= b != nullptr && b->has_step;
    overdue |= now_ms > HangDeadlineMs(policy, b, start_ms);
  }
  if (!any_step || !overdue) return std::nullopt;
  // A rank's position: its step, with "never reported" behind step 0.
  auto position = [&](uint32_t r) -> int64_t {
    const RankBeat* b = beat_of(r);
    return b != nullptr && b->has_step ? static_cast<int64_t>(b->step) : -1;
  };
  int64_t lowest = INT64_MAX, highest = INT64_MIN;
  for (uint32_t r : ranks) {
    lowest = std::min(lowest, position(r));
    highest = std::max(highest, position(r));
  }
  HangVerdict v;
  std::vector<uint32_t> others;
  if (lowest < highest) {
    for (uint32_t r : ranks)
      (position(r) == lowest ? v.stuck : others).push_back(r);
  } else {
    int64_t earliest = INT64_MAX;
    for (uint32_t r : ranks)
      if (const RankBeat* b = beat_of(r))
        earliest = std::min(earliest, b->advanced_ms);
    for (uint32_t r : ranks) {
      const RankBeat* b = beat_of(r);
      bool first = b == nullptr || b->advanced_ms <= earliest + kTieMs;
      (first ? v.stuck : others).push_back(r);
    }
  }
  const RankBeat* b = beat_of(v.stuck.front());
  v.has_step = lowest >= 0;
  v.step = v.has_step ? static_cast<uint64_t>(lowest) : 0;
  v.first_step = InFirstStep(b, start_ms);
  v.timeout_s = v.first_step ? policy.first_step_s : HangTimeoutS(policy, *b);
  const int64_t since = v.first_step ? start_ms : b->advanced_ms;
  v.silent_s = static_cast<double>(now_ms - since) / 1000.0;
  if (b != nullptr && b->has_pause) v.pause_reason = b->pause_reason;
  const bool plural = v.stuck.size() > 1;
  v.detail =
      absl::StrCat(plural ? "ranks " : "rank ", RankRanges(v.stuck),
                   v.has_step ? absl::StrCat(" stopped at step ", v.step)
                              : std::string(" never reported a step"),
                   v.first_step ? " (first step after the start)" : "",
                   ", silent ", absl::StrFormat("%.1f", v.silent_s),
                   " s > timeout ", absl::StrFormat("%.1f", v.timeout_s), " s");
  if (!v.pause_reason.empty())
    absl::StrAppend(&v.detail, " (pause declared: ", v.pause_reason, ")");
  if (!others.empty()) {
    if (lowest < highest)
      absl::StrAppend(&v.detail, "; ranks ", RankRanges(others),
                      " are ahead and wait for ", plural ? "them" : "it");
    else
      absl::StrAppend(&v.detail, "; ranks ", RankRanges(others),
                      " stopped later at the same step");
  }
  return v;
}

}  // namespace ckpt::coordinator
