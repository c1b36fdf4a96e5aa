// RankSlots: one rank's shared-memory arena and the engine's table of its
// slots — what each slot holds (state, step, shard generation, bytes), who
// writes it, how many restores read it — and the slot policy: which slot a
// new save or a load from disk takes (PickSlot).
//
// The table is authoritative; every transition below copies the slot's
// entry into the arena's header for tools and clients, and nothing reads it
// back, so a client scribbling over shared memory cannot corrupt it. The
// engine reads the fields freely but changes a slot only through these
// transitions. The arena is shared with the Prefaulter while it faults in
// the slots beyond slot 0; slots [0, ready_slots) may be used.
//
// Thread-safety: none of its own. The JobTable (job_table.h) holds one per
// (job, rank), and its lock is held around every use; an arena is created
// or grown with the lock released while `creating` makes other requests
// for the rank wait.
#ifndef CKPT_DAEMON_CORE_RANK_SLOTS_H_
#define CKPT_DAEMON_CORE_RANK_SLOTS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "shm/arena.h"

namespace ckpt::daemon {

struct Slot {
  shm::SlotState state = shm::SlotState::kFree;
  uint64_t step = 0;
  uint64_t gen = 0;  // generation of the shard it holds; 0 once it was dropped
  uint64_t image_bytes = 0;
  uint32_t readers = 0;
  uint64_t writer = 0;  // lease of the client writing it
  // Holds a shard whose persist failed for good, or keeps failing: a newer
  // save may take it (never while the persister writes from it).
  bool reclaimable = false;
  // Which write filled the slot (unique per RankSlots, set by BeginWrite;
  // 0 once freed): an upload reading the slot without a lease checks it
  // after the transfer to know that no save overwrote the bytes meanwhile.
  uint64_t write_no = 0;
};

class RankSlots {
 public:
  // The slot a new image goes into, or -1: the first ready free slot, else
  // the ready durable (or reclaimable) slot of the oldest step. Never the
  // slot of the newest step in memory (what a crashed trainer restores),
  // nor one being written, persisted or read.
  int PickSlot() const;
  // OK when the arena may be replaced by one with larger slots: no slot is
  // read, written, staged or being persisted. The error names slot_bytes.
  [[nodiscard]] absl::Status CheckGrowable(const std::string& job,
                                           uint32_t rank_no,
                                           uint64_t slot_bytes) const;
  // Takes a freshly created arena: every slot free (and mirrored so), only
  // slot 0 ready until the prefaulter reports.
  void Install(std::shared_ptr<shm::Arena> created);
  // Takes an arena re-attached after a restart: every page is reserved,
  // every slot free until recovery finds its image (not mirrored yet).
  void Reattach(std::shared_ptr<shm::Arena> attached);
  // Forgets the arena and its slots (the caller unregisters/unlinks it).
  void Clear();
  // State transitions; each mirrors the slot.
  // A save (write lease `lease`, held by writer_pid) or a load from disk
  // (lease 0) starts writing `slot`: whatever it held is gone.
  void BeginWrite(uint32_t slot, uint64_t step, uint64_t image_bytes,
                  uint64_t lease, pid_t writer_pid);
  // `slot` now holds the shard of generation `gen` of `step`: kStaged once
  // committed, kDurable once loaded from disk or found after a restart.
  void Hold(uint32_t slot, shm::SlotState state, uint64_t step, uint64_t gen,
            uint64_t image_bytes);
  // The persister takes the slot's shard (kPersisting), wrote it
  // (kDurable), or will retry (kStaged).
  void SetState(uint32_t slot, shm::SlotState state);
  // The slot's shard failed to persist, for good or too often (it is
  // retried): back to kStaged, and the slot may be reused like a durable
  // one.
  void FailPersist(uint32_t slot);
  // A restore starts reading `slot` (EndRead ends it).
  void AddReader(uint32_t slot) { ++slots[slot].readers; }
  // Frees `slot`: it holds nothing.
  void Free(uint32_t slot);
  // Write lease `lease` on `slot` ended without a commit: the slot frees if
  // that lease still writes it. Returns whether the slot changed.
  bool EndWrite(uint32_t slot, uint64_t lease);
  // A read lease on `slot` ended: one reader less; the last reader frees a
  // slot whose shard was dropped meanwhile. Returns whether it was freed.
  bool EndRead(uint32_t slot);
  // The shard of generation `gen` in `slot` is dropped: the slot frees, or,
  // while persisted or read, is marked (gen 0) for the persister or the
  // last reader to free.
  void DropShard(int slot, uint64_t gen);

  // Shared with the prefaulter while it faults in the arena's slots.
  std::shared_ptr<shm::Arena> arena;
  std::vector<Slot> slots;
  // An arena for this rank is being created (or grown) outside the engine
  // mutex; whoever needs the rank's arena waits until it is installed.
  bool creating = false;
  bool registered = false;  // arena memory registered with the backend
  // Slots [0, ready_slots) have their pages reserved and may be used.
  uint32_t ready_slots = 0;
  absl::Status reserve_error;  // the prefaulter could not ready the others
  uint64_t writes_begun = 0;   // the last write_no handed out

 private:
  // Copies slot `slot`'s entry into the arena header; writer_pid is the pid
  // holding its write lease (0 if none).
  void Mirror(uint32_t slot, pid_t writer_pid);
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_RANK_SLOTS_H_
