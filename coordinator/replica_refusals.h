// Replica holders that refused a node's copies for want of room
// (doc/replicas.md). A sender whose target answers "replica_memory_bytes:
// ... do not fit" says so in its heartbeats (HeartbeatRequest.
// replica_refused); the placement then gives that sender another holder
// (PlacementNode.excluded) under the same failure-domain rules. Soft state,
// like the placement: a refusal stands while both nodes run the incarnation
// (epoch) it was made in, so a restarted holder (its memory empty) or a
// restarted sender (its shards perhaps smaller) is tried again; a
// coordinator restart forgets it and the next refusal brings it back.
// Thread-compatible: the coordinator's mutex guards it.
#ifndef CKPT_COORDINATOR_REPLICA_REFUSALS_H_
#define CKPT_COORDINATOR_REPLICA_REFUSALS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "coordinator.pb.h"

namespace ckpt::coordinator {

// Checks HeartbeatRequest.replica_refused when set: a node id, a printable
// reason of at most kMaxReasonBytes. InvalidArgument naming the field.
[[nodiscard]] absl::Status ValidateReplicaRefusal(
    const coord::v1::HeartbeatRequest& req);

class ReplicaRefusals {
 public:
  static constexpr size_t kMaxReasonBytes = 1024;
  // A node's epoch while it is alive, else 0.
  using EpochOf = std::function<uint64_t(const std::string&)>;

  // `holder` refused `source`'s copies; true when that is news (the
  // placement must be computed again). Refusals whose nodes restarted or
  // died are dropped here.
  bool Note(const std::string& source, const std::string& holder,
            const EpochOf& epoch_of);
  // The holders `source` must not be given now.
  std::set<std::string> Excluded(const std::string& source,
                                 const EpochOf& epoch_of) const;

 private:
  struct Refusal {
    uint64_t source_epoch = 0;
    uint64_t holder_epoch = 0;
  };
  static bool Stands(const std::string& source, const std::string& holder,
                     const Refusal& r, const EpochOf& epoch_of);
  std::map<std::string, std::map<std::string, Refusal>> by_source_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REPLICA_REFUSALS_H_
