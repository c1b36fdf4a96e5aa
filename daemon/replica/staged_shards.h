// StagedShards: what the replica path (replica_service.h, replicator.h)
// may read of this node's own staged shards, implemented by ReplicaSource
// (replica_source.h; the Engine forwards to it). A snapshot is taken under the
// job table's lock and names the slot and the write that filled it; the bytes
// are then read with no lock held and no lease (a save is never blocked by a
// replica), and Unchanged tells afterwards whether a save overwrote the slot
// meanwhile (the read is then discarded), as an upload from a slot does.
//
// Thread-safety: implementations are safe to call concurrently.
#ifndef CKPT_DAEMON_REPLICA_STAGED_SHARDS_H_
#define CKPT_DAEMON_REPLICA_STAGED_SHARDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "replica.pb.h"
#include "shm/arena.h"

namespace ckpt::daemon {

struct StagedCopy {
  replica::v1::ShardCopy copy;        // checksums all known (see below)
  std::shared_ptr<shm::Arena> arena;  // keeps the mapping while read
  int slot = -1;
  uint64_t write_no = 0;
  // Each tensor's chunk hashes as the save sent them (TensorMeta's), in
  // index order; empty for a tensor without them.
  std::vector<std::vector<uint64_t>> chunk_hashes;
  const char* data() const { return arena->slot_data(slot); }
};

class StagedShards {
 public:
  virtual ~StagedShards() = default;
  // The rank's shard of `step` in memory (nullopt for step: its newest),
  // staged or durable. NotFound naming the step when there is none;
  // Unavailable while a device tensor's checksum is not known yet (the
  // persister computes it: try again once the shard is durable).
  [[nodiscard]] virtual absl::StatusOr<StagedCopy> SnapshotStaged(
      const std::string& job, std::optional<uint64_t> step, uint32_t rank) = 0;
  // Whether the slot still holds the bytes of the snapshot's write.
  virtual bool StagedUnchanged(const std::string& job, uint32_t rank,
                               const StagedCopy& snap) = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_STAGED_SHARDS_H_
