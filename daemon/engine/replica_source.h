// ReplicaSource: peer replicas on this node's side (doc/replicas.md).
// What the replicate stage and the replica listener read of this node's
// shards in memory (a snapshot taken under the table's lock, the bytes
// read with no lock held: staged_shards.h), and a PREFETCH's fetch of a
// shard from a peer straight into the slot the trainer restores from,
// which OpenRestore waits for instead of failing.
//
// Thread-safety: every method takes the table's lock itself (callers must
// not hold it); safe to call concurrently.
#ifndef CKPT_DAEMON_ENGINE_REPLICA_SOURCE_H_
#define CKPT_DAEMON_ENGINE_REPLICA_SOURCE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/replica/ranged_read.h"
#include "daemon/replica/staged_shards.h"
#include "daemon/state/node_state.h"
#include "replica.pb.h"

namespace ckpt::daemon {

class ReplicaSource : public StagedShards {
 public:
  // `node` must outlive the source.
  explicit ReplicaSource(NodeState& node) : node_(node) {}

  absl::StatusOr<StagedCopy> SnapshotStaged(const std::string& job,
                                            std::optional<uint64_t> step,
                                            uint32_t rank) override;
  bool StagedUnchanged(const std::string& job, uint32_t rank,
                       const StagedCopy& snap) override;
  // See Engine::BeginFetches, EndFetch and FetchFromPeer.
  void BeginFetches(const std::string& job, uint64_t step,
                    const std::vector<uint32_t>& ranks);
  void EndFetch(const std::string& job, uint64_t step, uint32_t rank);
  using PeerFetch = std::function<absl::StatusOr<replica::v1::ShardCopy>(
      const std::function<absl::StatusOr<char*>(
          const replica::v1::ShardCopy&)>&)>;
  [[nodiscard]] absl::Status FetchFromPeer(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      const std::string& key, std::optional<uint32_t> owner_uid,
      const PeerFetch& fetch, std::vector<uint64_t> save_digests);
  // A ranged fetch (doc/resharding.md, "Byte ranges from a peer"): `fetch`
  // calls its argument with each message of the peer's answer in order
  // (the first describes the copy) and returns the stream's outcome. The
  // answer must be of the save one of `save_digests` names (required: the
  // coordinator's committed digests are the trust anchor), every touched
  // tensor's chunk hashes must combine into the save's checksum, and
  // every touched chunk must hash to its own. DataLoss naming the field,
  // tensor and chunk otherwise, and nothing is kept.
  using RangeFetch = std::function<absl::Status(
      const std::function<absl::Status(replica::v1::RangeChunk&)>&)>;
  [[nodiscard]] absl::StatusOr<RangedSlot> FetchRangesFromPeer(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      std::optional<uint32_t> owner_uid, std::span<const ImageRange> ranges,
      const RangeFetch& fetch, const std::vector<uint64_t>& save_digests);
  // The same checks over any source (`from` names it in errors and logs;
  // the object tier's ranged GETs use it: doc/resharding.md). `read` calls
  // `begin` once with the copy's description and the save's chunk hashes
  // of the tensors the ranges touch (by tensor index), which takes the
  // slot and returns its image, then writes what it reads into that image
  // and lists each part in `arrived`, in image order, none overlapping.
  // `save_digests` is the trust anchor (required), as above.
  using RangeBegin = std::function<absl::StatusOr<char*>(
      const replica::v1::ShardCopy&,
      std::map<uint32_t, std::vector<uint64_t>>)>;
  using RangeRead = std::function<absl::Status(
      const RangeBegin& begin, std::vector<ImageRange>* arrived)>;
  [[nodiscard]] absl::StatusOr<RangedSlot> ReadRanges(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      std::optional<uint32_t> owner_uid, std::span<const ImageRange> ranges,
      const std::vector<uint64_t>& save_digests, const std::string& from,
      const RangeRead& read);

 private:
  using Section = NodeState::Section;

  // A slot of the rank's arena to write `copy`'s image into (the job made
  // here if it has none); `have` (may be null) set, AlreadyExists, when
  // the save ordered (IsOrderedSave: world_size, save_digests) is in
  // memory already. Another save of the step held here is dropped.
  absl::StatusOr<char*> TakeSlot(
      const std::string& job, uint32_t world_size, uint64_t step, uint32_t rank,
      std::optional<uint32_t> owner_uid, const replica::v1::ShardCopy& copy,
      std::vector<uint64_t>* tickets, std::shared_ptr<shm::Arena>* arena,
      int* slot, bool* have, std::span<const uint64_t> save_digests = {});

  NodeState& node_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_REPLICA_SOURCE_H_
