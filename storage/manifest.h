// The manifests on storage, encoded and decoded from one schema
// (proto/manifest.proto) with protobuf's JSON mapping; nothing else builds
// or parses them.
//
// A node manifest ("MANIFEST" or "MANIFEST.<node>", keys.h) is written by a
// node daemon once every rank it hosts is durable:
//   {"format":"ckptd-manifest-v1","job":"j","step":"42","world_size":2,
//    "shards":[{"rank":0,"key":"j/step-…/rank-00000.shard","bytes":"4096",
//               "tensors":3,"checksums_digest":"00000000deadbeef"}, …]}
// (older daemons wrote step and bytes as JSON numbers; both parse). In the
// one-node layout it lists every rank; a node's manifest lists the ranks it
// hosts.
//
// The global manifest ("MANIFEST.global") is written by the coordinator once
// every rank of the step is durable in the shared root, and only then does
// the job's last good step move:
//   {"format":"ckpt-global-manifest-v1","job":"j","step":"42","worldSize":2,
//    "shards":[{"rank":0,"key":"…","bytes":"4096",
//               "checksumDigest":"00000000deadbeef","nodeId":"n1"}, …]}
//
// Decoding treats the text as untrusted: anything malformed is DataLoss
// naming the key and the field, quoting at most a prefix of a bad value.
// Functions only; thread-safe.
#ifndef CKPT_STORAGE_MANIFEST_H_
#define CKPT_STORAGE_MANIFEST_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "manifest.pb.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/shard_format.h"

namespace ckpt::storage {

inline constexpr char kNodeManifestFormat[] = "ckptd-manifest-v1";
inline constexpr char kGlobalManifestFormat[] = "ckpt-global-manifest-v1";
// No manifest is larger (a 1M-rank global manifest is ~200 MiB; refuse past
// this instead of allocating what a corrupt size says).
inline constexpr uint64_t kMaxManifestBytes = 64 << 20;

// The digest of a shard's tensor checksums, in index order, that manifests
// record (daemon and coordinator compute it the same way).
uint64_t ChecksumsDigest(std::span<const uint64_t> checksums);
// The same, of a shard index's tensor checksums.
uint64_t ChecksumsDigest(const ShardInfo& info);
// 16 lowercase hex digits.
std::string DigestHex(uint64_t digest);

// A node manifest shard entry's chunk hashes (NodeManifestChunkHashes):
// AddChunkHashes appends tensor `tensor`'s (call in tensor order);
// ManifestChunkHashes checks every entry of `shard` against the shard's
// stored index `info` (decoded from the shard the entry names) and returns
// them by tensor: each names a tensor of the index, holds
// ChecksumChunks(its bytes) hashes, and they combine into its checksum.
// DataLoss naming `field`.chunk_hashes[j] and the tensor otherwise.
void AddChunkHashes(v1::NodeManifestShard* shard, uint32_t tensor,
                    std::span<const uint64_t> hashes);
[[nodiscard]] absl::StatusOr<std::map<uint32_t, std::vector<uint64_t>>>
ManifestChunkHashes(const v1::NodeManifestShard& shard, const ShardInfo& info,
                    std::string_view field);

// Node manifest. The caller fills job, step, world_size and shards; an
// empty format is written as kNodeManifestFormat.
std::string EncodeNodeManifest(v1::NodeManifest m);
// Parses and validates against the manifest's key (a kManifest key, else
// InvalidArgument): ParseNodeManifest, then the first of
// NodeManifestProblems as DataLoss.
[[nodiscard]] absl::StatusOr<v1::NodeManifest> DecodeNodeManifest(
    std::string_view json, std::string_view key);
// The two halves of DecodeNodeManifest, for a checker (ckptctl verify) that
// reports every problem and keeps checking what it can:
// ParseNodeManifest checks the JSON, the format, and that job and step are
// the ones the key says (nothing else can be trusted otherwise);
// NodeManifestProblems lists, each naming the field: world_size 0, a
// one-node manifest (key without a node) that does not list every rank
// once, a rank out of range or repeated, a shard key that is not its rank's
// shard of this step (IsShardKeyOf), a checksums_digest not 16 hex digits,
// chunk_hashes out of tensor order, past the entry's tensors, of a length
// not a multiple of 8 or empty, or more in all than the shard's bytes hold
// (ceil(bytes / 1 MiB) + one per tensor).
[[nodiscard]] absl::StatusOr<v1::NodeManifest> ParseNodeManifest(
    std::string_view json, std::string_view key);
std::vector<std::string> NodeManifestProblems(const v1::NodeManifest& m,
                                              std::string_view key);

// Global manifest. Printed by hand (manifest_json.h), byte for byte the
// text protobuf's JSON mapping gives, which it falls back to.
std::string EncodeGlobalManifest(const v1::GlobalManifest& m);
// Parses and validates: format, job, step as expected, world_size > 0, one
// shard per rank in [0, world_size), keys valid storage keys, 16-hex-digit
// digests. (It does not yet require IsShardKeyOf: the coordinator accepts
// the keys nodes report as they are; ckptctl verify checks them.)
[[nodiscard]] absl::StatusOr<v1::GlobalManifest> DecodeGlobalManifest(
    std::string_view json, std::string_view key, std::string_view job,
    uint64_t step);

// Reads a small object whole (at most kMaxManifestBytes).
[[nodiscard]] absl::StatusOr<std::string> ReadManifestText(
    Backend& backend, std::string_view key);

// Writes at ManifestKey(m.job(), m.step(), node) (durable, atomic through the
// backend's commit) / reads back and decodes.
[[nodiscard]] absl::Status WriteNodeManifest(Backend& backend,
                                             const v1::NodeManifest& m,
                                             std::string_view node = "");
[[nodiscard]] absl::StatusOr<v1::NodeManifest> ReadNodeManifest(
    Backend& backend, std::string_view key);
// At GlobalManifestKey(m.job(), m.step()).
[[nodiscard]] absl::Status WriteGlobalManifest(Backend& backend,
                                               const v1::GlobalManifest& m);
[[nodiscard]] absl::StatusOr<v1::GlobalManifest> ReadGlobalManifest(
    Backend& backend, std::string_view job, uint64_t step);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_MANIFEST_H_
