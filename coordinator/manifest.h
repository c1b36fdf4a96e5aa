// The global manifest of a step: written by the coordinator to the shared
// root once every rank of the step is durable there, and only then does the
// job's "last good step" move. JSON (protobuf's JSON mapping of
// coord.v1.GlobalManifest) at GlobalManifestKey(job, step), e.g.
//   {"format":"ckpt-global-manifest-v1","job":"j","step":"42","worldSize":2,
//    "shards":[{"rank":0,"key":"j/step-…/rank-00000.shard","bytes":"4096",
//               "checksumDigest":"00000000deadbeef","nodeId":"n1"}, …]}
// Readers (the coordinator on rollback, ckptd on prefetch) go through
// DecodeGlobalManifest, which refuses anything malformed with DataLoss naming
// the key and the field. Functions only; thread-safe.
#ifndef CKPT_DAEMON_COORDINATOR_MANIFEST_H_
#define CKPT_DAEMON_COORDINATOR_MANIFEST_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "coordinator.pb.h"
#include "storage/backend.h"

namespace ckpt::coordinator {

inline constexpr char kGlobalManifestFormat[] = "ckpt-global-manifest-v1";

// "<job>/step-<20 digits>/MANIFEST.global": next to the node daemons'
// per-node "MANIFEST" keys, never the same object.
std::string GlobalManifestKey(std::string_view job, uint64_t step);
// 16 lowercase hex digits.
std::string DigestHex(uint64_t digest);

std::string EncodeGlobalManifest(const coord::v1::GlobalManifest& m);
// Parses and validates: format, job, step and world size as expected, one
// shard per rank in [0, world_size), non-empty keys, 16-hex-digit digests.
absl::StatusOr<coord::v1::GlobalManifest> DecodeGlobalManifest(std::string_view json,
                                                               std::string_view key,
                                                               std::string_view job,
                                                               uint64_t step);

// Writes (durable, atomic through the backend's commit) / reads back.
absl::Status WriteGlobalManifest(storage::Backend* backend, const coord::v1::GlobalManifest& m);
absl::StatusOr<coord::v1::GlobalManifest> ReadGlobalManifest(storage::Backend* backend,
                                                             std::string_view job, uint64_t step);

}  // namespace ckpt::coordinator

#endif  // CKPT_DAEMON_COORDINATOR_MANIFEST_H_
