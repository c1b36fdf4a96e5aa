// ReplicaRefusals (replica_refusals.h).
#include "coordinator/replica_refusals.h"

#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {

absl::Status ValidateReplicaRefusal(const coord::v1::HeartbeatRequest& req) {
  if (!req.has_replica_refused()) return absl::OkStatus();
  const coord::v1::ReplicaRefusal& r = req.replica_refused();
  CKPT_RETURN_IF_ERROR(
      ValidateNodeId(r.holder_node_id(), "replica_refused.holder_node_id"));
  if (r.holder_node_id() == req.node_id())
    return absl::InvalidArgumentError(
        absl::StrCat("replica_refused.holder_node_id: ", r.holder_node_id(),
                     " is the reporting node; it is never its own target"));
  return ValidatePrintable(r.reason(), "replica_refused.reason",
                           ReplicaRefusals::kMaxReasonBytes,
                           /*allow_empty=*/true);
}

bool ReplicaRefusals::Stands(const std::string& source,
                             const std::string& holder, const Refusal& r,
                             const EpochOf& epoch_of) {
  return r.source_epoch != 0 && epoch_of(source) == r.source_epoch &&
         epoch_of(holder) == r.holder_epoch;
}

bool ReplicaRefusals::Note(const std::string& source, const std::string& holder,
                           const EpochOf& epoch_of) {
  const Refusal now{epoch_of(source), epoch_of(holder)};
  if (now.source_epoch == 0 || now.holder_epoch == 0) return false;
  std::map<std::string, Refusal>& mine = by_source_[source];
  std::erase_if(mine, [&](const auto& kv) {
    return !Stands(source, kv.first, kv.second, epoch_of);
  });
  auto [it, added] = mine.emplace(holder, now);
  return added;
}

std::set<std::string> ReplicaRefusals::Excluded(const std::string& source,
                                                const EpochOf& epoch_of) const {
  std::set<std::string> out;
  auto mine = by_source_.find(source);
  if (mine == by_source_.end()) return out;
  for (const auto& [holder, r] : mine->second)
    if (Stands(source, holder, r, epoch_of)) out.insert(holder);
  return out;
}

}  // namespace ckpt::coordinator
