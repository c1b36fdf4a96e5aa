// Retention: which steps of a job are whole, which are durable, which ones
// the engine may drop, and what this node's manifest of a step says. Pure
// functions over the engine's step table (daemon/core/step_state.h): they read
// it and decide, and the Engine applies the decision (drops the shards,
// queues the manifest write and the deletes).
//
// In cluster mode (a node id is set) only the ranks the coordinator says
// this node hosts count, and nothing older than the coordinator's
// keep_from (the oldest step the job may still restore) is dropped; while
// keep_from is unknown nothing is.
//
// Thread-safety: the functions keep no state; callers hold the job table's lock
// while the step table they pass can change.
#ifndef CKPT_DAEMON_CORE_RETENTION_H_
#define CKPT_DAEMON_CORE_RETENTION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/step_state.h"
#include "manifest.pb.h"

namespace ckpt::daemon {

// What the coordinator says of a job on this node (cluster mode).
struct Hosting {
  std::set<uint32_t> ranks;           // the ranks this node hosts
  std::optional<uint64_t> keep_from;  // the oldest step still restorable
};

// Whether `step` can be restored: every counted rank (all world_size ranks,
// or the hosted ones when `hosting` is given) has a shard, none failed for
// good, and each is durable or still in a slot. *durable says whether every
// one of those shards is on disk.
bool StepComplete(const Step& step, uint32_t world_size, const Hosting* hosting,
                  bool* durable);

// The step below which retention drops every shard, or nullopt to drop
// nothing: keeps the newest `retain_steps` steps that have a manifest (none
// when retain_steps is 0 or fewer exist) and, in cluster mode, anything
// from hosting->keep_from on (nothing is dropped without it).
// With `object`, the steps counted are those whose object manifest is
// written (the object tier's retention) instead of the local manifest.
std::optional<uint64_t> RetentionCutoff(const std::map<uint64_t, Step>& steps,
                                        uint32_t retain_steps, bool cluster,
                                        const Hosting* hosting,
                                        bool object = false);

// The steps that can never become whole here (one of their shards failed
// for good) beyond the newest `retain_steps` steps: they do not count as
// retained steps, so RetentionCutoff alone would keep them forever. Never
// hosting->keep_from itself; nothing when retain_steps is 0.
std::vector<uint64_t> BrokenStepsToDrop(const std::map<uint64_t, Step>& steps,
                                        uint32_t retain_steps,
                                        const Hosting* hosting);

// Local-only retention's decision: the (step, rank) of every shard to drop
// now — those of the steps below RetentionCutoff, and of the steps
// BrokenStepsToDrop names — in step order.
std::vector<std::pair<uint64_t, uint32_t>> ShardsToDrop(
    const std::map<uint64_t, Step>& steps, uint32_t retain_steps, bool cluster,
    const Hosting* hosting);

// Tiered retention's object half (with an object tier): the steps that go
// from both tiers now, in step order — those below the object tier's
// cutoff (RetentionCutoff over the object manifests, keeping
// `retain_object`), and those that can never be whole (BrokenStepsToDrop,
// beyond the newest `retain_steps`), which count in neither tier's retain.
std::vector<uint64_t> ObjectTierStepsToDrop(
    const std::map<uint64_t, Step>& steps, uint32_t retain_object,
    uint32_t retain_steps, bool cluster, const Hosting* hosting);

// Tiered retention's local half (with an object tier), over the steps
// left once the object tier's retention ran: of the steps below the local
// cutoff (RetentionCutoff over the local manifests), those whose local
// copy may go because the object tier holds the whole step (local_only),
// and those that can never be whole here (whole: they go from both tiers,
// as without tiers). A complete step still uploading keeps its files (the
// upload may need them).
struct LocalTierDrops {
  std::vector<uint64_t> local_only;
  std::vector<uint64_t> whole;
};
LocalTierDrops LocalTierDropsOf(const std::map<uint64_t, Step>& steps,
                                uint32_t retain_steps, uint32_t world_size,
                                bool cluster, const Hosting* hosting);

// The (rank, generation) of each of the step's shards: a manifest built
// from the step still describes it while these are unchanged.
std::vector<std::pair<uint32_t, uint64_t>> ShardGenerations(const Step& step);

// This node's manifest of a complete, durable step.
storage::v1::NodeManifest NodeManifestOf(const std::string& job,
                                         uint64_t step_no, uint32_t world_size,
                                         const Step& step);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_RETENTION_H_
