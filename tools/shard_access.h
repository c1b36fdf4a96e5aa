// Offline access to what ckptd stores, for ckptctl: opening a root directory
// (or the layout around one file) as a storage::Backend, sorting a root's
// keys by kind (storage/keys.h: one-node and cluster layouts alike),
// resolving a ShardSelector to a key, and streaming a shard's bytes through
// storage::ShardReader, which checks every tensor against its stored
// checksum. Everything read is untrusted: errors are DataLoss naming the key
// and tensor. Not thread-safe.
#ifndef CKPT_TOOLS_SHARD_ACCESS_H_
#define CKPT_TOOLS_SHARD_ACCESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/shard_format.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/text_output.h"

namespace ckpt::tools {

// Opens an existing directory read-only in spirit (the tools never write
// through it), or an object store root "s3://BUCKET[/PREFIX]" (endpoint,
// region and credentials from the AWS_* environment or credentials file:
// storage/object_backend.h). NotFound naming `flag` if dir is missing or
// not a directory.
[[nodiscard]] absl::StatusOr<std::unique_ptr<storage::Backend>> OpenRoot(
    const std::string& dir, const std::string& flag);

// The objects under a prefix of a root, by kind. Keys that do not parse
// (storage::ParseKey) are kept apart with the reason, except that any
// "*.shard" is a shard (its header then says where it belongs).
struct RootContents {
  std::vector<std::string> shards;
  std::vector<std::string> node_manifests;    // MANIFEST, MANIFEST.<node>
  std::vector<std::string> global_manifests;  // MANIFEST.global
  std::vector<std::pair<std::string, std::string>>
      unrecognized;  // manifest-like names: key, why
};
[[nodiscard]] absl::StatusOr<RootContents> ScanRoot(storage::Backend& backend,
                                                    const std::string& prefix);

struct OpenedShard {
  std::unique_ptr<storage::Backend> backend;
  std::string key;
  std::string
      path;  // for messages: the file on disk, or s3://bucket/prefix/key
};
// What a user calls the object at key under root: the file on disk, or
// "s3://bucket/prefix/key".
std::string DisplayPath(const storage::Backend& backend,
                        const std::string& root, const std::string& key);
// Either sel.file, or all of sel.root, sel.job, sel.step, sel.rank. On a
// cluster root the rank's shard is "rank-R.<node>.shard": sel.node picks the
// node when more than one wrote that rank. A FILE inside a root's layout
// (".../<job>/step-N/<name>") opens that root, so its key is the full key;
// such a FILE may also be a manifest. FILE may also be
// "s3://BUCKET/[PREFIX/]JOB/step-N/NAME".
[[nodiscard]] absl::StatusOr<OpenedShard> OpenShard(const ShardSelector& sel);

// Called for bytes of the file outside tensors (header, index, padding,
// footer) and for each piece of a tensor, in file order. A sink error stops
// the stream and is returned.
struct ShardSink {
  std::function<absl::Status(uint64_t offset, const char* data, uint64_t len)>
      other;
  std::function<absl::Status(const storage::ShardTensor& t, const char* data,
                             uint64_t len)>
      tensor;
  // After every piece of t went through `tensor` and its checksum matched
  // (also for an empty tensor).
  std::function<absl::Status(const storage::ShardTensor& t)> tensor_done;
};
// Reads the whole shard in file order, verifying each tensor once its last
// piece went through; a mismatch is DataLoss naming the tensor (the bytes
// already handed to the sink must then be discarded by the caller).
[[nodiscard]] absl::Status StreamShard(storage::ShardReader& reader,
                                       const ShardSink& sink,
                                       Progress* progress);

// Prints the manifest at key (any kind, decoded and validated) as inspect
// does a shard; path names it in the output.
[[nodiscard]] absl::Status InspectManifest(storage::Backend& backend,
                                           const std::string& key,
                                           const std::string& path, bool json);

// "0x0123456789abcdef".
std::string HexChecksum(uint64_t v);
// "[1024, 4096]".
std::string ShapeString(const storage::ShardTensor& t);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_SHARD_ACCESS_H_
