// NodeAgent (node_agent.h): health re-checks. The coordinator asks for a
// check in a heartbeat's answer (run_health_check: `ckptctl health`, or a
// spare about to take ranks whose report is old); an idle node re-checks on
// its own every health_recheck. The checks run on a detached thread (a
// hung shared root must not hold up heartbeats or shutdown); the report
// goes with the first heartbeat after they finish.
#include "absl/strings/str_cat.h"
#include "daemon/agent/node_agent.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

void NodeAgent::AddHealthReport(cv1::HeartbeatRequest* req) {
  if (!health_run_) return;
  std::lock_guard<std::mutex> lock(health_run_->mu);
  if (!health_run_->done) return;
  *req->mutable_health_report() = health_run_->report;
  req->set_health_check_id(health_run_->id);
}

void NodeAgent::TakeHealthOrder(const cv1::HeartbeatRequest& sent,
                                const cv1::HeartbeatResponse& resp) {
  if (sent.has_health_report()) {
    // Answered: the coordinator has it; a registration sends it from now.
    health_report_ = sent.health_report();
    health_run_.reset();
  }
  if (health_run_ || !options_.health_check) return;  // one at a time
  const uint64_t asked = resp.run_health_check();
  if (asked != 0 && asked != health_last_id_) {
    LogInfo(absl::StrCat("health: the coordinator asks for a check (request ",
                         asked, ")"));
    StartHealthCheck(asked);
    return;
  }
  if (options_.health_recheck.count() <= 0 ||
      std::chrono::steady_clock::now() - health_last_run_ <
          options_.health_recheck)
    return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [job, h] : hosting_)
      if (!h.ranks.empty()) return;  // busy: only on request
  }
  StartHealthCheck(0);
}

void NodeAgent::StartHealthCheck(uint64_t id) {
  if (id != 0) health_last_id_ = id;
  health_last_run_ = std::chrono::steady_clock::now();
  auto run = std::make_shared<HealthRun>();
  run->id = id;
  health_run_ = run;
  std::thread([run, check = options_.health_check] {
    cv1::NodeHealthReport report = check();
    std::string failed;
    for (const cv1::HealthCheck& c : report.checks())
      if (!c.passed())
        absl::StrAppend(&failed, " ", c.name(), ": ", c.reason());
    if (failed.empty())
      LogInfo("health: re-check passed");
    else
      LogWarning("health: re-check failed:" + failed);
    std::lock_guard<std::mutex> lock(run->mu);
    run->report = std::move(report);
    run->done = true;
  }).detach();
}

}  // namespace ckpt::daemon
