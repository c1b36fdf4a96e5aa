// Recovery of a restarted daemon: its state rebuilt from the catalog and
// the shared memory that outlived it. Arenas are re-attached, each shard
// found in its slot (the image checked against its record) or in its file,
// what is not yet durable queued for its persist again, and manifests and
// uploads that were owed queued again; a shard lost with the memory is
// dropped from the catalog. The shards found are kept for the node's
// first report to a coordinator (ReportRecovered).
#ifndef CKPT_DAEMON_ENGINE_RECOVERY_H_
#define CKPT_DAEMON_ENGINE_RECOVERY_H_

#include "absl/status/status.h"
#include "daemon/state/node_state.h"

namespace ckpt::daemon {

// Runs at the engine's open, after NodeState::Wire and before any other
// thread exists: without the lock, which it would hold across the
// catalog's reads and the arenas' maps.
[[nodiscard]] absl::Status RecoverFromCatalog(NodeState& node)
    ABSL_NO_THREAD_SAFETY_ANALYSIS;

// Cluster mode, once, after the node's first registration: reports every
// shard recovered that is still here (STAGED, then DURABLE when it is
// durable in the commit tier). Takes the lock.
void ReportRecovered(NodeState& node);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_RECOVERY_H_
