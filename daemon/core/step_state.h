// The daemon's record of a checkpoint step on this node: each rank's shard
// (its catalog record, its validated index, its phase (shard_phase.h), the
// slot holding it) and whether this node's manifest of the step is
// written. Plain data: each job of the JobTable (job_table.h) has a step
// table; the Engine changes it, retention.h reads it.
//
// Thread-safety: none; callers hold the job table's lock (job_table.h).
#ifndef CKPT_DAEMON_CORE_STEP_STATE_H_
#define CKPT_DAEMON_CORE_STEP_STATE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "catalog.pb.h"
#include "daemon/core/shard_phase.h"
#include "storage/shard_format.h"

namespace ckpt::daemon {

// The copies of a shard a restore reads, in the fallback ladder's order.
enum class ShardCopy { kMemory, kFile, kObject };

struct Shard {
  catv1::ShardRecord
      rec;  // what the catalog records (tensors as v1::TensorMeta)
  // The validated index, kept from commit (or recovery, or prefetch) on:
  // the persister encodes and checks from it; rec.tensors() is its copy
  // for the catalog and the RPC replies.
  storage::ShardInfo info;
  // Only Start and MoveTo set it (the record's state follows).
  ShardPhase phase = ShardPhase::kStaged;
  uint64_t gen = 0;
  // The digest the STAGED report carried: of the index as committed, where
  // a device tensor's checksum is still 0 (the persister computes it).
  // Every later report of this save names it, so the coordinator can tell
  // the same save from another one; unset for shards this node did not
  // commit (recovered, prefetched: their checksums are all known).
  std::optional<uint64_t> staged_digest;
  // A save committed without a job generation: when the trainer that
  // committed it started (PeerCreds::started_ms; 0: unknown, or the save
  // has a generation). Memory only: a boot clock reading.
  int64_t trainer_started_ms = 0;
  int slot = -1;  // slot that holds the image, -1 if none
  // Where the slot's image came from: a commit (kMemory), or a load of the
  // local file or of the object tier's copy (a restore's load, a
  // prefetch), so that a bad image there names the stored copy as bad.
  ShardCopy slot_copy = ShardCopy::kMemory;
  uint32_t attempts = 0;
  // Object tier: the shard is also in the object store (same key), and
  // local retention deleted its local file (restores read the object).
  bool uploaded = false;
  bool local_gone = false;

  // A new save (a commit, a prefetch, a recovered record) starts its life
  // in `first`; the record's state follows.
  void Start(ShardPhase first);
  // Moves the shard to `to` (a legal transition; an illegal one is a bug
  // and is refused with a log line) and derives the record's state.
  bool MoveTo(ShardPhase to);
};

// Where a restore of a shard reads it from: OpenRestore's one choice
// (restorer.cc). kSlot: the slot that holds it (committed there, or
// loaded or fetched earlier). kFileIfReadable: its local file, read by the
// client itself when OpenRestore finds that the caller may (else as
// kLoad). kLoad: read from storage (the local file, or the object tier's
// copy once local retention dropped it) into a slot first. kLost: neither
// in memory nor durable. The client verifies every copy.
enum class RestoreCopy { kSlot, kFileIfReadable, kLoad, kLost };
RestoreCopy RestoreCopyOf(const Shard& shard, bool client_may_read_file);

// Whether `have`, this node's shard of a step and rank, is the save a
// PREFETCH orders: one of `world_size` ranks whose digest (its tensors'
// checksums, storage::ChecksumsDigest, or the one its STAGED report named)
// is among `save_digests` (empty: any). Anything else bears the same step
// number but is another save: one of a timeline the job abandoned while
// this node was away (it shrank, or rewound, and saved that step again).
bool IsOrderedSave(const Shard& have, uint32_t world_size,
                   std::span<const uint64_t> save_digests);

// How a failed persist is retried (EngineOptions' persist_retry_*).
struct PersistRetryPolicy {
  uint32_t max_attempts = 3;
  std::chrono::milliseconds delay{200};
  std::chrono::milliseconds max_delay{30000};
};

// What a persist's outcome does to its shard: the persist stage's one
// decision (Engine::RecordPersist applies it to the job table).
//  kOrphan: the save went (deleted, or replaced by a save of another
//    generation) while it was written; the file goes too (delete_file)
//    when it was written and no shard of that step and rank is left whose
//    file has the same key.
//  kDurable: written: kPersisting -> kDurable.
//  kAbandon: DataLoss, the slot's bytes changed after the commit; no
//    retry can help: -> kFailed.
//  kRetry: any other failure: back to kStaged, persisted again after
//    retry_after (the delay doubling per failed attempt, up to max_delay),
//    for as long as the bytes are in memory; release_slot once
//    max_attempts failed, so that a newer save may take the slot rather
//    than wait for the disk (the shard then fails for good when it does).
struct PersistVerdict {
  enum Kind { kOrphan, kDurable, kAbandon, kRetry } kind = kDurable;
  bool delete_file = false;
  bool release_slot = false;
  std::chrono::milliseconds retry_after{0};
};
// `mine`: the persisted save is still the step's shard (same generation);
// `key_in_use`: a shard of that step and rank exists (only read when not
// mine); `failed_attempts`: of this save, this one included.
PersistVerdict PersistVerdictOf(bool mine, bool key_in_use,
                                absl::StatusCode code, uint32_t failed_attempts,
                                const PersistRetryPolicy& policy);

struct Step {
  std::map<uint32_t, Shard> shards;  // by rank
  bool manifest = false;             // this node's manifest is written
  bool object_manifest = false;      // ... and in the object tier
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_STEP_STATE_H_
