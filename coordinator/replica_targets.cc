#include "coordinator/replica_targets.h"

#include <utility>

namespace ckpt::coordinator {

const std::map<std::string, std::string>& ReplicaTargets::Current(
    Candidates candidates, const ReplicaRefusals::EpochOf& epoch_of,
    int64_t now_ms) {
  if (!stale_) return targets_;
  if (!now_ && candidates_ > kExactNodes && now_ms >= computed_ms_ &&
      now_ms - computed_ms_ < kMinAgeMs)
    return targets_;
  std::vector<PlacementNode> nodes = candidates();
  for (PlacementNode& p : nodes)
    if (p.source) p.excluded = refusals_.Excluded(p.id, epoch_of);
  candidates_ = nodes.size();
  targets_ = PlaceReplicas(std::move(nodes));
  stale_ = false;
  now_ = false;
  computed_ms_ = now_ms;
  return targets_;
}

bool ReplicaTargets::Refused(const std::string& source,
                             const std::string& holder, Candidates candidates,
                             const ReplicaRefusals::EpochOf& epoch_of,
                             int64_t now_ms) {
  const auto& now = Current(candidates, epoch_of, now_ms);
  auto it = now.find(source);
  if (it == now.end() || it->second != holder ||
      !refusals_.Note(source, holder, epoch_of))
    return false;
  stale_ = true;
  now_ = true;
  return true;
}

}  // namespace ckpt::coordinator
