#include "coordinator/hearing.h"

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator {

Hearing::Hearing(std::function<int64_t()> now_ms)
    : now_ms_(std::move(now_ms)) {}

void Hearing::RestartWindows(std::string_view why) {
  const int64_t now = now_ms_();
  int64_t cur = heard_since_ms_.load();
  while (cur < now && !heard_since_ms_.compare_exchange_weak(cur, now)) {
  }
  absl::MutexLock lock(&mu_);
  ++deaf_spells_;
  last_why_ = std::string(why);
}

bool Hearing::NoteWake(int64_t late_ms, int64_t limit_ms) {
  if (late_ms <= limit_ms) return false;
  {
    absl::MutexLock lock(&mu_);
    ++late_wakes_;
  }
  RestartWindows(absl::StrCat("the failure detector woke ", late_ms,
                              " ms late (the process could not run)"));
  return true;
}

Hearing::Stats Hearing::stats() const {
  Stats s;
  s.shed_heartbeats = shed_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  s.deaf_spells = deaf_spells_;
  s.late_wakes = late_wakes_;
  s.last_why = last_why_;
  return s;
}

}  // namespace ckpt::coordinator
