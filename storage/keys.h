// Every key on storage, built and parsed in one place (leveldb's
// filename.h). A job's objects live under "<job>/step-<20 digits>/":
//
//   rank-<5+ digits>.shard          a rank's shard, one-node layout
//   rank-<5+ digits>.<node>.shard   the same written by node <node> (cluster)
//   MANIFEST                        a one-node daemon's manifest of the step
//   MANIFEST.<node>                 node <node>'s manifest of the step
//   MANIFEST.global                 the coordinator's global manifest
//
// Job and node names follow ValidateJobName ([A-Za-z0-9._-], ...). A node
// named "global" would collide with the global manifest: ValidateNodeId
// refuses it, and ParseKey reads "MANIFEST.global" as the global manifest.
// Ranks are zero-padded to five digits and may use more. Building never fails
// (callers validate names first); ParseKey refuses anything else with
// InvalidArgument naming the part. Functions only; thread-safe.
#ifndef CKPT_STORAGE_KEYS_H_
#define CKPT_STORAGE_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckpt::storage {

inline constexpr std::string_view kGlobalManifestSuffix = "global";

// "<job>/"
std::string JobPrefix(std::string_view job);
// "<job>/step-00000000000000000042/"
std::string StepPrefix(std::string_view job, uint64_t step);
// ".../rank-00003.shard", or ".../rank-00003.<node>.shard" when node is set.
std::string ShardKey(std::string_view job, uint64_t step, uint32_t rank,
                     std::string_view node = "");
// ".../MANIFEST", or ".../MANIFEST.<node>" when node is set.
std::string ManifestKey(std::string_view job, uint64_t step,
                        std::string_view node = "");
// ".../MANIFEST.global"
std::string GlobalManifestKey(std::string_view job, uint64_t step);

// A node id as it appears in keys: ValidateJobName's rules, and not
// "global" (that name is the global manifest's). InvalidArgument naming
// field.
[[nodiscard]] absl::Status ValidateNodeId(std::string_view node,
                                          std::string_view field = "node");

enum class KeyKind { kShard, kManifest, kGlobalManifest };

struct ParsedKey {
  KeyKind kind = KeyKind::kShard;
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;  // kShard only
  std::string node;   // kShard and kManifest; empty in the one-node layout

  bool operator==(const ParsedKey&) const = default;
};

// The key ParsedKey names: ParseKey(KeyOf(p)) == p for every valid p.
std::string KeyOf(const ParsedKey& p);

// Parses any key above; InvalidArgument naming the part otherwise, e.g.
// "key \"j/step-1/rank-0.shard\": step: \"step-1\" is not \"step-\" and 20
// digits".
[[nodiscard]] absl::StatusOr<ParsedKey> ParseKey(std::string_view key);

// Parses a step's directory name ("step-<20 digits>").
[[nodiscard]] absl::StatusOr<uint64_t> ParseStepDir(std::string_view name);

// True when key is a shard of exactly (job, step, rank), written by any node
// or in the one-node layout; anything else could name a file outside the job.
bool IsShardKeyOf(std::string_view key, std::string_view job, uint64_t step,
                  uint32_t rank);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_KEYS_H_
