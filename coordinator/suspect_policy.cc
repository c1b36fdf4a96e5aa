#include "coordinator/suspect_policy.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace ckpt::coordinator {

int ClaimLog::Add(const SuspectPolicy& policy, int64_t now_ms) {
  const int64_t window_ms = static_cast<int64_t>(policy.window_s * 1000);
  while (!ms_.empty() && now_ms - ms_.front() > window_ms) ms_.pop_front();
  ms_.push_back(now_ms);
  // Bounded: more than `after` in the window adds nothing to a decision.
  while (ms_.size() > static_cast<size_t>(std::max(policy.after, 1)))
    ms_.pop_front();
  return static_cast<int>(ms_.size());
}

v1::HealthCheck SuspectCheck(const SuspectPolicy& policy, int count) {
  v1::HealthCheck c;
  c.set_name(kSuspectCheck);
  c.set_passed(false);
  c.set_figure(count);
  c.set_unit("claims");
  c.set_reason(absl::StrFormat(
      "%d copies claimed bad by restores on this node within %g s were "
      "verified good by the node (--suspect-after-claims %d): suspect its "
      "memory or device",
      count, policy.window_s, policy.after));
  return c;
}

}  // namespace ckpt::coordinator
