// NodeAgent (node_agent.h): restore fallback reports, bounded in number
// and age, sent one by one from the report thread.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "daemon/agent/node_agent.h"
#include "daemon/agent/node_agent_rpc.h"
#include "daemon/core/engine_util.h"
#include "util/retry.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

void NodeAgent::ReportFallback(FallbackReport report) {
  // The coordinator refuses an unprintable or long reason: keep what it
  // can show rather than lose the report.
  constexpr size_t kMaxReasonBytes = 512;
  if (report.reason.size() > kMaxReasonBytes)
    report.reason.resize(kMaxReasonBytes);
  for (char& c : report.reason)
    if (c < 0x20 || c > 0x7e) c = '?';
  std::lock_guard<std::mutex> lock(mu_);
  if (fallbacks_.size() >= std::max<size_t>(options_.max_queued_fallbacks, 1)) {
    const FallbackReport& old = fallbacks_.front().report;
    LogWarning(absl::StrCat("dropping the fallback report of job ", old.job,
                            " step ", old.step, " rank ", old.rank,
                            ": more than ", options_.max_queued_fallbacks,
                            " waiting"));
    fallbacks_.pop_front();
    ++fallbacks_dropped_;
  }
  fallbacks_.push_back(QueuedFallback{
      std::move(report), std::chrono::steady_clock::now(), ++fallback_ids_});
  cv_.notify_all();
}

void NodeAgent::SendFallbacksLocked(std::unique_lock<std::mutex>& lock) {
  while (!fallbacks_.empty() && !stopping_) {
    const auto now = std::chrono::steady_clock::now();
    const FallbackReport& f = fallbacks_.front().report;
    if (now - fallbacks_.front().queued > options_.fallback_ttl) {
      LogWarning(absl::StrCat("dropping the fallback report of job ", f.job,
                              " step ", f.step, " rank ", f.rank,
                              ": not accepted by the coordinator within ",
                              options_.fallback_ttl.count(), " ms"));
      fallbacks_.pop_front();
      ++fallbacks_dropped_;
      continue;
    }
    const uint64_t epoch = epoch_.load();
    if (now < next_fallback_try_ || epoch == 0)
      return;  // backing off, or (re-)registering
    const uint64_t id = fallbacks_.front().id;
    cv1::ReportFallbackRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch);
    req.set_job(f.job);
    req.set_step(f.step);
    req.set_rank(f.rank);
    req.set_copy(f.copy);
    req.set_reason(f.reason);
    if (f.next_step) req.set_next_step(*f.next_step);
    req.set_next_copy(f.next_copy);
    req.set_verified_bad(f.verified_bad);
    lock.unlock();
    cv1::ReportFallbackResponse resp;
    grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::ReportFallback, req,
                                  &resp, options_.rpc_timeout);
    lock.lock();
    // ReportFallback may have dropped it meanwhile (past the bound).
    const bool still_front = !fallbacks_.empty() && fallbacks_.front().id == id;
    if (s.ok() || !(IsTransient(s) || Fenced(s))) {
      if (s.ok()) {
        ++fallbacks_sent_;
      } else {
        LogWarning(absl::StrCat("fallback report of job ", req.job(), " step ",
                                req.step(), " rank ", req.rank(),
                                " refused: ", s.error_message()));
        ++fallbacks_dropped_;
      }
      if (still_front) fallbacks_.pop_front();
      fallback_backoff_ = std::chrono::milliseconds(0);
      continue;
    }
    // Unreachable, shedding load, or this epoch or placement refused (the
    // heartbeat thread registers again; a plan moves ranks): later.
    fallback_backoff_ = std::min(
        std::max(fallback_backoff_ * 2, std::chrono::milliseconds(100)),
        std::chrono::milliseconds(5000));
    next_fallback_try_ = std::chrono::steady_clock::now() + fallback_backoff_;
    return;
  }
}

}  // namespace ckpt::daemon
