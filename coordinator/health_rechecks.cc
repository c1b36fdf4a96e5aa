#include "coordinator/health_rechecks.h"

#include <algorithm>

#include "coordinator/health_state.h"

namespace ckpt::coordinator {

void HealthRechecks::Merge(const v1::NodeHealthReport& fresh,
                           v1::NodeHealthReport* report) {
  auto* checks = report->mutable_checks();
  checks->erase(std::remove_if(checks->begin(), checks->end(),
                               [&](const v1::HealthCheck& c) {
                                 for (const v1::HealthCheck& f : fresh.checks())
                                   if (f.name() == c.name()) return true;
                                 return false;
                               }),
                checks->end());
  for (const v1::HealthCheck& c : fresh.checks()) {
    if (report->checks_size() >= kMaxHealthChecks) break;
    *report->add_checks() = c;
  }
}

}  // namespace ckpt::coordinator
