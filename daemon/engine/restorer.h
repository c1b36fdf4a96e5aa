// Restorer: the restore path. Which step a restore gets (Latest), where
// its bytes come from (OpenRestore's one decision: memory, the caller
// reading the file itself, or a load into a slot from the local or the
// object tier), the loads (restorer_load.cc; a coordinator's PREFETCH is
// one), and the fallback ladder when a client finds a copy bad
// (CloseRestore, restorer_fallback.cc): the daemon checks the copy itself,
// and a copy that is bad is dropped for the next one (memory → file →
// object), the shard failing when none is left.
//
// Thread-safety: every method takes the table's lock itself (callers must
// not hold it) and releases it for I/O (a load, a check of a copy, a stat
// of the file a caller would read); safe to call concurrently.
#ifndef CKPT_DAEMON_ENGINE_RESTORER_H_
#define CKPT_DAEMON_ENGINE_RESTORER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "daemon/core/ranged_slot.h"
#include "daemon/state/node_state.h"
#include "manifest.pb.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

class Restorer {
 public:
  // `node` must outlive the restorer.
  explicit Restorer(NodeState& node) : node_(node) {}

  [[nodiscard]] absl::StatusOr<v1::LatestResponse> Latest(
      const PeerCreds& peer, const v1::LatestRequest& req);
  // Told of a load's progress while OpenRestore runs (OpenRestoreStream):
  // where the slot is once its read starts (`where`, lease 0), then each
  // tensor (an index into where.tensors) whose bytes are in the slot and
  // match its checksum. Called without the lock; Verified from the reading
  // threads, possibly several at once, always after Started. A restore
  // that does not load calls neither.
  class LoadProgress {
   public:
    virtual ~LoadProgress() = default;
    virtual void Started(v1::OpenRestoreResponse where) = 0;
    virtual void Verified(uint32_t tensor) = 0;
  };
  [[nodiscard]] absl::StatusOr<v1::OpenRestoreResponse> OpenRestore(
      const PeerCreds& peer, const v1::OpenRestoreRequest& req,
      LoadProgress* progress = nullptr);
  [[nodiscard]] absl::Status CloseRestore(const PeerCreds& peer,
                                          const v1::CloseRestoreRequest& req);
  // The step's layout index (doc/resharding.md, "Restore into another
  // layout"): the TensorMeta of every rank of the step this node holds
  // (its table: memory, disk, object tier alike), and for the other ranks
  // the pieces the node manifests of the step list (MANIFEST.<node> in the
  // root, a shared root in a cluster, then the object tier), merged into
  // one index of the saved world size. Every manifest and index read is
  // validated; a rank no source describes is FailedPrecondition naming
  // the ranks. A whole tensor (no layout) that ranks here saved with other
  // dtypes or shapes (a per-rank skeleton) is left out. Reads storage with
  // the lock released. In a cluster the coordinator's index of the
  // committed step (LayoutIndexFromCoordinator) comes first; this is the
  // path when it has none.
  [[nodiscard]] absl::StatusOr<v1::LayoutIndexResponse> LayoutIndex(
      const PeerCreds& peer, const v1::LayoutIndexRequest& req);
  // The coordinator's index of the step (EngineOptions::step_index), with
  // the saved ranks this node holds; an error when it has none.
  [[nodiscard]] absl::StatusOr<v1::LayoutIndexResponse>
  LayoutIndexFromCoordinator(const PeerCreds& peer,
                             const v1::LayoutIndexRequest& req);
  // See Engine::Prefetch.
  [[nodiscard]] absl::Status Prefetch(const std::string& job,
                                      uint32_t world_size, uint64_t step,
                                      uint32_t rank, const std::string& key,
                                      std::optional<uint32_t> owner_uid);

 private:
  using Section = NodeState::Section;
  using Rank = RankSlots;

  // OpenRestore of a saved rank this node does not hold (a restore into
  // another layout reads every saved rank whose pieces it needs, those of
  // a lost node too): from the memory of a peer holding it (its owner's
  // slot, a replica: FetchSavedRankFromPeers), else loads it, as a
  // PREFETCH order would, from the key the step's node manifests name for
  // it (the root, a shared root in a cluster, then the object tier).
  // NotFound when none has it, naming every source tried.
  // Call with the lock released.
  [[nodiscard]] absl::Status FetchSavedRank(const std::string& job,
                                            uint64_t step, uint32_t rank);
  // The chunks of a saved rank this node's catalog holds (a durable shard
  // not in memory) that `ranges` (validated, inside its image) touch,
  // with the image's header, index and footer: ranged reads from where a
  // load would read it (its local file while it has the recorded size,
  // else the object tier: *from_object), into a slot held for the
  // caller's read, verified against the catalog's record of the save
  // (ReplicaSource::ReadRanges; doc/resharding.md, "Byte ranges from
  // storage"). FailedPrecondition when the record lacks what that needs
  // (a touched tensor of several chunks without chunk hashes, a device
  // tensor's checksum); DataLoss naming the tensor and chunk that does not
  // verify. Call with the lock released.
  [[nodiscard]] absl::StatusOr<RangedSlot> RangesFromStorage(
      const std::string& job, uint64_t step, uint32_t rank,
      std::span<const ImageRange> ranges, bool* from_object);
  // The chunks of a saved rank this node neither holds nor records (a lost
  // node's) that `ranges` (validated) touch, read from the key its node
  // manifest names (FindInNodeManifests: the root, then the object tier;
  // *from_object), verified against that manifest's entry: the stored
  // index's checksums digest to its checksums_digest, its chunk_hashes
  // combine into each touched tensor's checksum, each touched chunk
  // hashes to its own (doc/resharding.md, "A lost node's saved rank").
  // FailedPrecondition when the entry lacks what that needs (an older
  // manifest without chunk hashes or digest) or the ranges touch more than
  // a third of the rank; NotFound when no manifest names it; DataLoss
  // naming the field, tensor and chunk that does not verify. Call with the
  // lock released.
  [[nodiscard]] absl::StatusOr<RangedSlot> RangesFromManifest(
      const std::string& job, uint64_t step, uint32_t rank,
      std::span<const ImageRange> ranges, bool* from_object);
  // A saved rank's entry in the step's node manifests, and where it was
  // found; NotFound naming `tried` and each tier that has none.
  struct ManifestShard {
    storage::Backend* tier = nullptr;
    std::string manifest_key;
    uint32_t world_size = 0;
    storage::v1::NodeManifestShard shard;
    std::string field;  // "MANIFEST...: shards[i]", for errors
  };
  [[nodiscard]] absl::StatusOr<ManifestShard> FindInNodeManifests(
      const std::string& job, uint64_t step, uint32_t rank,
      std::vector<std::string>* tried);
  // What ReadStoredRanges reads and checks against: the catalog's record
  // of the save (its index: the stored one must place every tensor where
  // it does; its chunk hashes by name) or a node manifest's shard entry
  // (its chunk_hashes, checked by storage::ManifestChunkHashes).
  struct StoredRanges {
    storage::Backend* tier = nullptr;
    std::string key;
    uint64_t image_bytes = 0;
    uint32_t world_size = 0;
    std::optional<uint32_t> uid;
    std::vector<uint64_t> digests;  // the trust anchor (ReadRanges)
    std::string from;               // "the object tier", "the root"
    const storage::ShardInfo* trusted = nullptr;
    const std::map<std::string, std::vector<uint64_t>>* catalog_hashes =
        nullptr;
    const storage::v1::NodeManifestShard* manifest_shard = nullptr;
    std::string manifest_field;
  };
  // The ranged read itself (header, index, footer, touched chunks) and
  // ReplicaSource::ReadRanges' checks, for both. Call with the lock
  // released.
  [[nodiscard]] absl::StatusOr<RangedSlot> ReadStoredRanges(
      const std::string& job, uint64_t step, uint32_t rank,
      std::span<const ImageRange> ranges, const StoredRanges& src);
  // A saved rank this node does not hold, from a peer's memory
  // (EngineOptions::fetch_from_peers), one fetch of it at a time; OK at
  // once when it is in memory here. NotFound without a coordinator. Call
  // with the lock released.
  [[nodiscard]] absl::Status FetchSavedRankFromPeers(const std::string& job,
                                                     uint64_t step,
                                                     uint32_t rank);
  // LayoutIndex from what this node holds and the node manifests, once:
  // *absent gets the saved ranks nothing describes (the NotFound), and
  // *job_here false when this node has no such job.
  [[nodiscard]] absl::StatusOr<v1::LayoutIndexResponse> LayoutIndexHere(
      const PeerCreds& peer, const v1::LayoutIndexRequest& req,
      std::vector<uint32_t>* absent, bool* job_here);
  // OpenRestore: waits while a peer fetch of the shard runs.
  [[nodiscard]] absl::Status WaitFetch(const std::string& job, uint64_t step,
                                       uint32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // Restore's one decision: the path the caller may read the durable
  // shard's file (`key`, of image_bytes) from itself (a local file of the
  // recorded size that the caller's uid can open), or nullopt: the daemon
  // loads it into a slot. Stats the file: called without the lock.
  std::optional<std::string> ClientReadablePath(const PeerCreds& peer,
                                                const std::string& key,
                                                uint64_t image_bytes);
  // Loads a durable shard into a free slot of its rank's arena; releases
  // the lock during the read. Returns the shard, which may have moved.
  // *from_object (optional) says whether it came from the object tier.
  // read (optional): on success, holds the arena's queued slots back from
  // the end of the read on (Prefaulter::BeginRead), without a gap before
  // the restore's lease does.
  [[nodiscard]] absl::StatusOr<Shard*> LoadShard(
      const std::string& job, uint64_t step, uint32_t rank, double* load_s,
      bool* from_object = nullptr, LoadProgress* progress = nullptr,
      Prefaulter::ReadHold* read = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // dst is slot `slot` of `arena`, which its creation left reserved but
  // not faulted in (shm::Arena::slot_left_to_file): the object tier's
  // bytes are written through the arena's file; a local read faults the
  // slot in first. arena nullptr: dst is ordinary memory.
  struct SlotLeftToFile {
    shm::Arena* arena = nullptr;
    uint32_t slot = 0;
  };
  // Reads a shard image into dst from the local tier, or from the object
  // tier when the local copy is gone (or unreadable and uploaded);
  // verifies the object's tensor checksums. Called without the lock.
  [[nodiscard]] absl::Status ReadShardImage(
      const std::string& key, bool local, bool object,
      const storage::ShardInfo& info, char* dst, uint64_t bytes,
      bool* from_object, const SlotLeftToFile& to_file, LoadProgress* progress);
  // The fallback ladder: a client found `shard`'s `copy` failing
  // verification. Drops the slot's image; a bad local file with a copy in
  // the object tier is dropped (restores read the object next); with no
  // good copy left the shard fails (Latest falls back a step).
  void MarkBadCopy(Job& job, Shard& shard, ShardCopy copy,
                   const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());
  // A client claimed `shard`'s `copy` bad, and the daemon's own check
  // (`checked`: OK, or why it could not run) did not find it so: the copy
  // is kept, and the claim is counted and reported (FallbackReport's
  // verified_bad false).
  void ReportUnconfirmed(const Job& job, const Shard& shard, ShardCopy copy,
                         const std::string& claim, const absl::Status& checked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node_.table.mu());

  NodeState& node_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_RESTORER_H_
