// One rank's slots and the slot policy. See rank_slots.h.
#include "daemon/core/rank_slots.h"

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

int RankSlots::PickSlot() const {
  // The newest step in memory stays: it is what a crashed trainer restores.
  int newest = -1;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (s.state == shm::SlotState::kFree || s.state == shm::SlotState::kWriting)
      continue;
    if (newest < 0 || s.step > slots[newest].step) newest = static_cast<int>(i);
  }
  int best = -1;
  for (size_t i = 0; i < ready_slots && i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (s.readers > 0 || static_cast<int>(i) == newest) continue;
    if (s.state == shm::SlotState::kFree) return static_cast<int>(i);
    const bool reclaimable =
        s.reclaimable && s.state != shm::SlotState::kPersisting;
    if ((s.state == shm::SlotState::kDurable || reclaimable) &&
        (best < 0 || s.step < slots[best].step))
      best = static_cast<int>(i);
  }
  return best;
}

void RankSlots::Mirror(uint32_t slot, pid_t writer_pid) {
  const Slot& s = slots[slot];
  arena->SetSlotState(slot, s.state, s.step, static_cast<uint32_t>(writer_pid),
                      s.image_bytes);
}

absl::Status RankSlots::CheckGrowable(const std::string& job, uint32_t rank_no,
                                      uint64_t slot_bytes) const {
  // Growing replaces the arena; only allowed while it holds nothing that
  // is not on disk and nobody reads it.
  for (const Slot& s : slots)
    if (s.readers > 0 || s.state == shm::SlotState::kWriting ||
        s.state == shm::SlotState::kStaged ||
        s.state == shm::SlotState::kPersisting)
      return absl::FailedPreconditionError(
          absl::StrCat("slot_bytes: arena of rank ", rank_no, " of job '", job,
                       "' has ", arena->slot_bytes(),
                       "-byte slots and holds a step that is not durable yet; "
                       "cannot grow it to ",
                       slot_bytes));
  return absl::OkStatus();
}

void RankSlots::Install(std::shared_ptr<shm::Arena> created) {
  arena = std::move(created);
  ready_slots = 1;
  reserve_error = absl::OkStatus();
  slots.assign(arena->num_slots(), Slot{});
  for (uint32_t i = 0; i < arena->num_slots(); ++i) Mirror(i, 0);
}

void RankSlots::Reattach(std::shared_ptr<shm::Arena> attached) {
  arena = std::move(attached);
  slots.assign(arena->num_slots(), Slot{});
  ready_slots = arena->num_slots();  // Reattach reserves every page
}

void RankSlots::BeginWrite(uint32_t slot, uint64_t step, uint64_t image_bytes,
                           uint64_t lease, pid_t writer_pid) {
  slots[slot] = Slot{shm::SlotState::kWriting, step, 0, image_bytes, 0, lease};
  slots[slot].write_no = ++writes_begun;
  Mirror(slot, writer_pid);
}

void RankSlots::Hold(uint32_t slot, shm::SlotState state, uint64_t step,
                     uint64_t gen, uint64_t image_bytes) {
  Slot& s = slots[slot];
  s.writer = 0;
  s.state = state;
  s.step = step;
  s.gen = gen;
  s.image_bytes = image_bytes;
  Mirror(slot, 0);
}

void RankSlots::SetState(uint32_t slot, shm::SlotState state) {
  slots[slot].state = state;
  Mirror(slot, 0);
}

void RankSlots::FailPersist(uint32_t slot) {
  slots[slot].reclaimable = true;
  SetState(slot, shm::SlotState::kStaged);
}

void RankSlots::Free(uint32_t slot) {
  slots[slot] = Slot{};
  Mirror(slot, 0);
}

void RankSlots::Clear() {
  arena.reset();
  slots.clear();
  registered = false;
  ready_slots = 0;
}

bool RankSlots::EndWrite(uint32_t slot, uint64_t lease) {
  if (slots[slot].writer != lease) return false;
  slots[slot] = Slot{};  // never committed: the bytes mean nothing
  Mirror(slot, 0);
  return true;
}

bool RankSlots::EndRead(uint32_t slot) {
  Slot& s = slots[slot];
  if (s.readers == 0) return false;
  --s.readers;
  // A reader kept a slot whose shard was deleted meanwhile.
  if (s.readers == 0 && s.gen == 0 && s.state != shm::SlotState::kPersisting &&
      s.state != shm::SlotState::kWriting) {
    s = Slot{};
    Mirror(slot, 0);
    return true;
  }
  return false;
}

void RankSlots::DropShard(int slot, uint64_t gen) {
  if (slot < 0 || !arena) return;
  Slot& s = slots[slot];
  if (s.gen != gen) return;
  if (s.state == shm::SlotState::kPersisting || s.readers > 0) {
    s.gen = 0;  // the persister or the last reader frees it
    return;
  }
  s = Slot{};
  Mirror(static_cast<uint32_t>(slot), 0);
}

}  // namespace ckpt::daemon
