// Offline access to shard files for ckptctl: opening a root directory (or
// the directory of one file) as a storage::Backend, resolving a
// ShardSelector to a key, and streaming a shard's bytes while checking
// every tensor against its stored checksum. Everything read is untrusted:
// errors are DataLoss naming the key and tensor. Not thread-safe.
#ifndef CKPT_TOOLS_SHARD_ACCESS_H_
#define CKPT_TOOLS_SHARD_ACCESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/shard_format.h"
#include "tools/ctl_commands.h"
#include "tools/text_output.h"

namespace ckpt::tools {

// Opens an existing directory read-only in spirit (the tools never write
// through it). NotFound naming `flag` if dir is missing or not a directory.
absl::StatusOr<std::unique_ptr<storage::Backend>> OpenRoot(const std::string& dir,
                                                           const std::string& flag);

struct OpenedShard {
  std::unique_ptr<storage::Backend> backend;
  std::string key;
  std::string path;  // for messages: the file on disk
};
// Either sel.file, or all of sel.root, sel.job, sel.step, sel.rank.
absl::StatusOr<OpenedShard> OpenShard(const ShardSelector& sel);

// Called for bytes of the file outside tensors (header, index, padding,
// footer) and for each piece of a tensor, in file order. A sink error stops
// the stream and is returned.
struct ShardSink {
  std::function<absl::Status(uint64_t offset, const char* data, uint64_t len)> other;
  std::function<absl::Status(const storage::ShardTensor& t, const char* data, uint64_t len)> tensor;
  // After every piece of t went through `tensor` and its checksum matched
  // (also for an empty tensor).
  std::function<absl::Status(const storage::ShardTensor& t)> tensor_done;
};
// Reads the whole shard in file order, verifying each tensor once its last
// piece went through; a mismatch is DataLoss naming the tensor (the bytes
// already handed to the sink must then be discarded by the caller).
absl::Status StreamShard(storage::Backend& backend, const std::string& key,
                         const storage::ShardInfo& info, const ShardSink& sink,
                         Progress* progress);

// "0x0123456789abcdef".
std::string HexChecksum(uint64_t v);
// "[1024, 4096]".
std::string ShapeString(const storage::ShardTensor& t);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_SHARD_ACCESS_H_
