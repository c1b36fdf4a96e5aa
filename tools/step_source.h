// One complete step of a root, read as global tensors: what `ckptctl
// export` (a step to one safetensors file) and `ckptctl reshard` (a step to
// another world size) read.
//
// Open finds the step's manifest (the one-node "MANIFEST", else the
// coordinator's "MANIFEST.global"; a step with neither is not complete and
// is refused), opens every rank's shard it lists, checks each against the
// manifest (key, size, tensor count, checksums digest) and its header (job,
// step, rank), verifies every tensor's checksum (as `ckptctl verify` does),
// and builds the step's layout index from the shards' tensor indexes
// (storage::BuildLayoutIndex, as the daemon does). A node manifest's own
// layout index must be that same index. A ckpt.torch step's per-rank
// "%ckpt/header" and "%ckpt/skeleton" tensors (each rank's own structure,
// with its own pieces' shapes) are no part of a global tensor: they are
// left out of index(), and torch() says the step has them. Pieces that
// are replicas of one
// box (a whole tensor saved by every data-parallel rank) must hold the same
// bytes (their checksums agree), since only one of them is read.
//
// AssembleRequested then fills the pieces of a requested layout (a
// LayoutIndex over the step's tensors, as the planner takes it) from the
// saved pieces, through storage::PlanReshardTensors and ForEachByteRun,
// window by window, the window's runs that are contiguous in one saved
// piece (the rows of a column-sharded piece) read at once: memory is two
// windows (kWindowBytes: the bytes, and a scratch for those reads) plus one
// tensor's byte runs, never a whole tensor or shard. Everything read is
// untrusted; errors name the key, rank and tensor. Not thread-safe.
#ifndef CKPT_TOOLS_STEP_SOURCE_H_
#define CKPT_TOOLS_STEP_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/layout.h"
#include "storage/shard_reader.h"

namespace ckpt::tools {

class StepSource {
 public:
  // The bytes handed to AssembleRequested's sink at a time: a multiple of
  // kChecksumChunk, so a sink may feed them to a ChunkHasher as they come.
  static constexpr uint64_t kWindowBytes = 16ull << 20;

  // NotFound naming --job or --step when there is nothing of them under
  // root; FailedPrecondition when the step has no manifest (not complete);
  // NotFound naming the key of a listed shard that is missing; DataLoss
  // naming the key (and tensor) of a damaged shard or manifest.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StepSource>> Open(
      const std::string& root, const std::string& job, uint64_t step);

  const std::string& job() const { return job_; }
  uint64_t step() const { return step_; }
  uint32_t world_size() const { return world_size_; }
  // "MANIFEST" or "MANIFEST.global": where the shard list came from.
  const std::string& manifest_key() const { return manifest_key_; }
  // Every saved piece of every tensor (tensors sorted by name).
  const storage::LayoutIndex& index() const { return index_; }
  // The shard tensor a saved piece is.
  const storage::ShardTensor& PieceTensor(uint64_t piece) const;
  // Bytes of every shard verified, and of their tensors.
  uint64_t shard_bytes() const { return shard_bytes_; }
  // Rank r's shard, open (verified).
  storage::ShardReader& shard(uint32_t r) { return *readers_[r]; }
  // Every rank's shard has ckpt.torch's "%ckpt/header" and
  // "%ckpt/skeleton" (left out of index()).
  bool torch() const { return torch_; }

  // Sink of AssembleRequested: `len` bytes of requested piece `request`
  // starting at `offset` in it (row-major).
  using Sink = absl::FunctionRef<absl::Status(uint64_t request, uint64_t offset,
                                              const char* data, uint64_t len)>;
  // Fills every requested piece from the saved ones: tensor after tensor
  // (requested index order), each piece's bytes in order, in windows of at
  // most kWindowBytes. `requested` must name only tensors of index() with
  // their dtype and global shape (InvalidArgument naming the tensor
  // otherwise); a requested byte no saved piece holds is the planner's
  // error naming the tensor and region.
  [[nodiscard]] absl::Status AssembleRequested(
      const storage::LayoutIndex& requested, Sink sink);

 private:
  StepSource() = default;
  [[nodiscard]] absl::Status ReadManifest(const std::string& root);
  [[nodiscard]] absl::Status OpenShards();
  [[nodiscard]] absl::Status BuildIndex();

  std::string job_;
  uint64_t step_ = 0;
  uint32_t world_size_ = 0;
  std::unique_ptr<storage::Backend> backend_;
  std::string manifest_key_;
  std::string manifest_index_;  // the node manifest's layout_index, if any
  struct Listed {
    std::string key;
    uint64_t bytes = 0;
    bool has_tensors = false;
    uint64_t tensors = 0;
    std::string digest;  // empty: not listed
  };
  std::vector<Listed> listed_;                                  // by rank
  std::vector<std::unique_ptr<storage::ShardReader>> readers_;  // by rank
  storage::LayoutIndex index_;
  std::vector<uint32_t> piece_tensor_;  // saved piece -> tensor of its shard
  uint64_t shard_bytes_ = 0;
  bool torch_ = false;
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_STEP_SOURCE_H_
