#include "coordinator/cordon_policy.h"

#include <algorithm>

namespace ckpt::coordinator {

int IncidentLog::Add(const CordonPolicy& policy, int64_t now_ms,
                     const std::string& job, uint64_t generation,
                     IncidentKind kind) {
  const int64_t window_ms = static_cast<int64_t>(policy.window_s * 1000);
  while (!incidents_.empty() && now_ms - incidents_.front().ms > window_ms)
    incidents_.pop_front();
  const bool known =
      std::any_of(incidents_.begin(), incidents_.end(), [&](const Incident& i) {
        return i.job == job && i.generation == generation;
      });
  if (!known) incidents_.push_back({now_ms, job, generation, kind});
  // Bounded: more than `after` in the window adds nothing to a decision.
  while (incidents_.size() > static_cast<size_t>(std::max(policy.after, 1)) + 1)
    incidents_.pop_front();
  return static_cast<int>(incidents_.size());
}

int IncidentLog::Count(IncidentKind kind) const {
  return static_cast<int>(
      std::count_if(incidents_.begin(), incidents_.end(),
                    [&](const Incident& i) { return i.kind == kind; }));
}

}  // namespace ckpt::coordinator
