// Launcher: a trainer that outlives SIGKILL makes its node unhealthy (see
// ckptrun.h). Its process is in uninterruptible sleep (a hung driver, file
// system or device): it still holds its memory and device, so a restart on
// this node would fail or hang too, and the coordinator moves the ranks.
#include "absl/strings/str_cat.h"
#include "coordinator/client/channel.h"
#include "tools/ckptrun.h"
#include "util/retry.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

}  // namespace

void Launcher::NoteUnkillable(const std::vector<Unkillable>& stuck) {
  for (const Unkillable& u : stuck) {
    unkillable_ =
        absl::StrCat("trainer of rank ", u.rank, " (pid ", u.pid, ", state ",
                     std::string(1, u.state), ") still there ",
                     TrainerSet::kKillWait.count(), " s after SIGKILL");
    Log(absl::StrCat(unkillable_, "; reporting this node unhealthy"));
  }
}

void Launcher::FlushNodeCheck() {
  if (unkillable_.empty() || epoch_ == 0) return;
  cv1::ReportNodeCheckRequest req;
  req.set_node_id(opts_.node_id);
  req.set_epoch(epoch_);
  cv1::HealthCheck* c = req.mutable_check();
  c->set_name("trainer_unkillable");
  c->set_passed(false);
  c->set_reason(unkillable_);
  cv1::ReportNodeCheckResponse resp;
  absl::Status s = coordinator::CoordStatus(
      client_->Call(&cv1::Coordinator::Stub::ReportNodeCheck, req, &resp,
                    kRpcTimeout),
      "ReportNodeCheck", client_->current());
  if (IsUnreachable(s)) return;  // the next poll sends it again
  Log(s.ok() ? absl::StrCat("node reported unhealthy: ", unkillable_)
             : absl::StrCat("reporting the node unhealthy refused: ",
                            s.message()));
  unkillable_.clear();
}

}  // namespace ckpt::tools
