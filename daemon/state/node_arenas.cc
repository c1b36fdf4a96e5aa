// A rank's shared-memory arena: its name, creation and growth outside the
// job table's lock (the job record written first), and dropping it (the
// syscalls on the drop queue, arena_drops.h).
// See node_state.h and rank_slots.h.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/state/node_state.h"
#include "util/status.h"

namespace ckpt::daemon {

std::string NodeState::ArenaName(const std::string& job, uint32_t rank) const {
  return absl::StrCat("/", options.shm_prefix, ".", job, ".r", rank);
}

void NodeState::DropArena(Job& job, uint32_t rank_no, bool unlink) {
  auto it = job.ranks.find(rank_no);
  if (it == job.ranks.end() || !it->second.arena) return;
  RankSlots& r = it->second;
  JobTable::DetachSlot(job, rank_no, JobTable::kAnySlot);
  // The unregister, unlink and unmap run on the drop queue's thread.
  arena_drops->Drop(r.arena, r.registered, unlink);
  r.Clear();
}

absl::StatusOr<RankSlots*> NodeState::EnsureArena(const std::string& name,
                                                  uint32_t rank_no,
                                                  uint64_t slot_bytes,
                                                  ArenaFor use) {
  Job* job = nullptr;
  RankSlots* r = nullptr;
  for (;;) {
    job = table.Find(name);
    if (job == nullptr)
      return absl::AbortedError(
          absl::StrCat("job: '", name, "' was deleted meanwhile; retry"));
    r = &job->ranks[rank_no];
    if (!r->creating) break;
    table.Wait(
        JobTable::Waiter::kArena);  // another request creates this rank's arena
  }
  // An arena the job's uid truncated is replaced as one that grows is:
  // the shards in its slots are lost anyway.
  const bool truncated = r->arena && !r->arena->CheckIntact().ok();
  if (r->arena && !truncated && r->arena->slot_bytes() >= slot_bytes) return r;
  if (truncated) slot_bytes = std::max(slot_bytes, r->arena->slot_bytes());
  const bool grow = r->arena != nullptr;
  if (grow) CKPT_RETURN_IF_ERROR(r->CheckGrowable(name, rank_no, slot_bytes));
  shm::ArenaOptions ao;
  // A grown arena is created beside the old one, which stays whole until
  // the new one exists: a refusal (no room in /dev/shm) changes nothing.
  ao.name = ArenaName(name, rank_no) + (grow ? ".grow" : "");
  ao.job = name;
  ao.rank = rank_no;
  // A saved rank of a larger world size (a resized job restores it).
  ao.world_size = std::max(job->rec.world_size(), rank_no + 1);
  ao.slot_bytes = slot_bytes;
  ao.num_slots = job->rec.num_slots();
  ao.user_uid = job->rec.uid();
  ao.huge_dir = options.huge_dir;
  ao.huge_required = options.huge_required;
  // The first save takes slot 0 (PickSlot takes the first free
  // slot): only its pages are faulted before Register answers.
  ao.prefault_slots = 1;
  ao.slot0_faulted_by_load = use != ArenaFor::kSave;
  ao.slot0_written_through_file = use == ArenaFor::kObjectLoad;
  r->creating = true;
  table.Unlock();
  // A dropped arena of this name is unlinked first, so that its queued
  // unlink cannot remove the new one.
  arena_drops->AwaitUnlinked(ao.name);
  if (grow) arena_drops->AwaitUnlinked(ArenaName(name, rank_no));
  (void)shm::Arena::Unlink(ao.name);  // a leftover nobody references
  if (!ao.huge_dir.empty()) (void)shm::Arena::Unlink(ao.huge_dir + ao.name);
  const auto create_start = std::chrono::steady_clock::now();
  auto created = shm::Arena::Create(ao);
  const double create_s = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - create_start)
                              .count();
  if (created.ok() && (*created)->huge_pages())
    LogInfo(absl::StrCat("arena ", (*created)->name(), ": 2 MiB pages",
                         ", created in ", create_s, " s"));
  else if (created.ok() && !ao.huge_dir.empty())
    LogWarning(absl::StrCat(
        "arena ", (*created)->name(),
        ": 4 KiB pages in /dev/shm: ", (*created)->huge_fallback()));
  table.Relock();
  // Nothing erases a job or a rank while one of its arenas is being created.
  job = table.Find(name);
  r = &job->ranks[rank_no];
  absl::Status s = created.status();
  if (s.ok() && grow) s = r->CheckGrowable(name, rank_no, slot_bytes);
  std::shared_ptr<shm::Arena> arena;
  if (s.ok()) {
    arena = std::move(*created);
    // The job's record describes the arena before it is installed: a
    // record that cannot be written (a full disk) leaves the rank as it
    // was. The record in memory changes with the edit (another rank's
    // arena, created meanwhile, records this one's too) and comes back if
    // the write fails; the rank stays `creating` until then, with the lock
    // released during the write (and a grown arena's rename).
    const bool had_old = job->rec.arena_slot_bytes().count(rank_no) > 0;
    const uint64_t old_bytes =
        had_old ? job->rec.arena_slot_bytes().at(rank_no) : 0;
    const uint64_t old_slot_bytes = job->rec.slot_bytes();
    (*job->rec.mutable_arena_slot_bytes())[rank_no] = arena->slot_bytes();
    if (job->rec.slot_bytes() < arena->slot_bytes())
      job->rec.set_slot_bytes(arena->slot_bytes());
    CatalogEdit edit;
    edit.PutJob(job->rec);
    const uint64_t ticket = QueueEdit(std::move(edit), kMemoryOnly);
    table.Unlock();
    s = writer->Wait(ticket);
    if (s.ok() && grow) s = arena->Rename(ArenaName(name, rank_no));
    table.Relock();
    job = table.Find(name);
    r = &job->ranks[rank_no];
    if (!s.ok()) {
      if (had_old)
        (*job->rec.mutable_arena_slot_bytes())[rank_no] = old_bytes;
      else
        job->rec.mutable_arena_slot_bytes()->erase(rank_no);
      job->rec.set_slot_bytes(old_slot_bytes);
      for (const auto& [n, bytes] : job->rec.arena_slot_bytes())
        if (job->rec.slot_bytes() < bytes) job->rec.set_slot_bytes(bytes);
      if (job->recorded) {
        // Back to the old arena (the write may have landed; a later one of
        // another rank may carry this one's entry).
        CatalogEdit back;
        back.PutJob(job->rec);
        QueueEdit(std::move(back), /*sync=*/true);
      }
    }
  }
  r->creating = false;
  table.Wake(JobTable::Waiter::kArena);
  table.Wake(JobTable::Waiter::kSlot);
  if (!s.ok()) {
    if (arena)
      arena_drops->Drop(std::move(arena), /*registered=*/false,
                        /*unlink=*/true);
    return s;
  }
  // The rename replaced the old arena's name, unless the two live in
  // different directories (/dev/shm and hugetlbfs).
  if (grow) DropArena(*job, rank_no, r->arena->name() != arena->name());
  r->Install(arena);
  prefaulter->Add(arena, /*first_slot=*/1);
  job->recorded = true;
  return r;
}

}  // namespace ckpt::daemon
