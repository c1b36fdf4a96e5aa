// The subcommands of ckptctl. Each Run* function validates its arguments,
// does the work, and prints its result to stdout: a human-readable table,
// or exactly one JSON object when `json` is set. Problems found in the data
// (a damaged tensor, a missing shard) are listed on stdout as part of the
// result; the returned Status is what decides the exit code, and its
// message names the path, key, tensor or flag concerned.
//
// Online commands talk to a running ckptd over its Unix socket; coordinator
// commands to ckpt-coordinator at HOST:PORT (every RPC with a 5 s deadline);
// offline ones read shard files under a root directory, or an object
// store root "s3://BUCKET/PREFIX", through storage::Backend.
// Not thread-safe (they own stdout while they run).
#ifndef CKPT_TOOLS_CTL_COMMANDS_H_
#define CKPT_TOOLS_CTL_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "coordinator/client/tls.h"

namespace ckpt::tools {

// ---- online (daemon RPCs) ----

[[nodiscard]] absl::Status RunList(const std::string& socket,
                                   const std::string& job, bool json);
absl::Status RunStatus(const std::string& socket, bool json);
// all_steps deletes every step of the job; otherwise `step` must be set.
[[nodiscard]] absl::Status RunDelete(const std::string& socket,
                                     const std::string& job,
                                     std::optional<uint64_t> step,
                                     bool all_steps, bool json);

// ---- coordinator (multi-node jobs) ----
// `coordinator` is "A:P[,B:P...]" (HA replicas: the leader is followed);
// `tls` as on every coordinator client (coordinator/client/tls.h).

// Nodes, jobs (placement, last good step, plan) and recent events.
[[nodiscard]] absl::Status RunCluster(const std::string& coordinator,
                                      const coordinator::TlsFiles& tls,
                                      bool json);
// Restarts the whole job at `step` (required; must be durable on every
// rank) and prints the new generation.
[[nodiscard]] absl::Status RunRollback(const std::string& coordinator,
                                       const coordinator::TlsFiles& tls,
                                       const std::string& job,
                                       std::optional<uint64_t> step, bool json);
// Resume a held job (PLAN_HELD): it plans once more, its count of plans
// without a commit reset.
[[nodiscard]] absl::Status RunResume(const std::string& coordinator,
                                     const coordinator::TlsFiles& tls,
                                     const std::string& job, bool json);
// Events with seq > after_seq: of one job and the cluster-wide ones (node
// registered, node dead), or (job empty) every event.
[[nodiscard]] absl::Status RunEvents(const std::string& coordinator,
                                     const coordinator::TlsFiles& tls,
                                     const std::string& job, uint64_t after_seq,
                                     bool json);
// ckptctl health (ctl_health.cc): runs the health checks of every alive
// node, or only `node` when not empty, waits up to timeout_s for their
// reports and shows them with the verdicts (an admin identity under mTLS;
// `network` also starts a round of the network check); `last` only shows
// the newest reports. DeadlineExceeded naming the nodes that did not
// answer in time.
struct HealthArgs {
  std::string node;
  bool last = false;
  bool network = false;
  int timeout_s = 60;
};
[[nodiscard]] absl::Status RunHealth(const std::string& coordinator,
                                     const coordinator::TlsFiles& tls,
                                     const HealthArgs& args, bool json);

// Cordons `node` (its ranks move to a spare; it takes none until
// uncordoned) for `reason` (printable, 1 to 512 bytes), or lets it back;
// ctl_cordon.cc. The coordinator needs an admin identity under mTLS.
[[nodiscard]] absl::Status RunCordon(const std::string& coordinator,
                                     const coordinator::TlsFiles& tls,
                                     const std::string& node,
                                     const std::string& reason, bool json);
[[nodiscard]] absl::Status RunUncordon(const std::string& coordinator,
                                       const coordinator::TlsFiles& tls,
                                       const std::string& node, bool json);

// The stacks a hang's launchers captured (of `generation`, or the newest
// hang's): every trainer of the stuck ranks' nodes.
[[nodiscard]] absl::Status RunStacks(const std::string& coordinator,
                                     const coordinator::TlsFiles& tls,
                                     const std::string& job,
                                     std::optional<uint64_t> generation,
                                     bool json);

// ---- offline (shard files) ----

// Names one shard: either a file path, or (root, job, step, rank[, node]).
struct ShardSelector {
  std::string file;
  std::string root;
  std::string job;
  std::optional<uint64_t> step;
  std::optional<uint32_t> rank;
  std::string node;  // cluster root: the node whose copy of the rank's shard
};

// A shard's header and tensor index; a manifest FILE's contents.
[[nodiscard]] absl::Status RunInspect(const ShardSelector& sel, bool json);

// What is on storage under root (or one job's part of it): every step with
// its shards by rank and node and its manifests (one-node, per node,
// global). Reads keys and manifests only; verify checks the bytes.
[[nodiscard]] absl::Status RunListRoot(const std::string& root,
                                       const std::string& job, bool json);

// Verifies every shard and manifest under root, or those of one job, one
// step, or one shard. DataLoss when anything is damaged or missing.
struct VerifyOptions {
  std::string root;
  std::string job;
  std::optional<uint64_t> step;
  std::optional<uint32_t> rank;
};
[[nodiscard]] absl::Status RunVerify(const VerifyOptions& opts, bool json);

// out ending in '/' or naming a directory: one raw file per tensor plus
// index.json; otherwise a verified copy of the shard file.
[[nodiscard]] absl::Status RunRestore(const ShardSelector& sel,
                                      const std::string& out, bool json);

// A safetensors file at out (format: "safetensors"), every tensor verified
// on the way; nothing is left at out on failure, and an existing out is
// refused unless force. sel names one shard (FILE, or root, job, step and
// rank), or a whole step (root, job and step, no rank): then the step's
// global tensors, each assembled from its pieces on every rank
// (tools/step_source.h), under its global name.
struct ExportArgs {
  ShardSelector sel;
  std::string out;
  std::string format = "safetensors";
  bool force = false;
};
[[nodiscard]] absl::Status RunExport(const ExportArgs& args, bool json);

// ckptctl reshard (ctl_reshard.cc): step `step` of `job` under `root`
// (complete, every shard verified) written as a checkpoint of world_size
// ranks into the new root `out` (one-node layout: shards, MANIFEST with
// its layout index, and the catalog a ckptd started on `out` recovers the
// step from). A tensor saved in pieces is split evenly along its split
// dimension as torch.chunk splits it; a whole tensor goes to every rank.
// `out` must not exist; nothing is left there on failure.
struct ReshardArgs {
  std::string root;
  std::string job;
  std::optional<uint64_t> step;
  uint32_t world_size = 0;
  std::string out;
  // The job's owner in the new root (its trainers' uid; the shard files
  // are chowned to it, which needs the right to); default: the caller's.
  std::optional<uint32_t> uid;
};
[[nodiscard]] absl::Status RunReshard(const ReshardArgs& args, bool json);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CTL_COMMANDS_H_
