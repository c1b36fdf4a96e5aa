// Named shared-memory arenas: one per (job, rank), owned by ckptd.
//
// The daemon creates an arena (its own, mode 0600; the registering uid may
// open it through an ACL entry, see segment_access.h): an arena /dev/shm
// cannot hold is refused at creation, never a SIGBUS
// later. Create allocates (fallocate) and pre-faults the header and the
// first `prefault_slots` slots; ReserveSlots() does the same for the rest
// later (a background thread), so that a first save waits only for the
// pages of the slot it writes. Until then the other slots must not be
// used: their pages are not reserved yet. A
// trainer attaches with Attach(): the header page read-only, the slots
// read-write. Because the daemon owns the segment, a trainer crash never
// loses a staged step, and a restarted daemon re-attaches with Reattach().
//
// Where the machine offers 2 MiB pages (a hugetlbfs mount with free pages,
// ArenaOptions::huge_dir), the segment is a file there, named by its path
// ("/dev/hugepages/ckptd.job.r0"): copies into a slot and O_DIRECT writes
// from it then touch one page-table entry per 2 MiB. Otherwise it is a
// POSIX shared-memory object ("/ckptd.job.r0", a file of /dev/shm).
//
// Layout: ArenaHeader at offset 0 (one page), then num_slots slots of
// slot_bytes each starting at slots_offset (2 MiB-aligned). A slot holds the
// exact image of a shard file (storage/shard_format.h).
//
// Slot states live in the header so both processes see them, but only the
// daemon writes them and it never trusts what it reads back: its own
// in-memory table is authoritative, the header is a mirror for tools and
// clients. Thread-safety: an Arena object is immutable after creation apart
// from SetSlotState, which is safe to call concurrently for different slots.
//
// The job's uid can open the segment read-write, so it can also truncate
// it under the daemon. The daemon's mappings are guarded
// (util/truncation_guard.h): a SIGBUS on one replaces it with zero pages
// instead of killing the daemon, and CheckIntact() tells whoever read or
// wrote the arena that its bytes were lost.
#ifndef CKPT_SHM_ARENA_H_
#define CKPT_SHM_ARENA_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "util/truncation_guard.h"

namespace ckpt::shm {

enum class SlotState : uint32_t {
  kFree = 0,
  kWriting = 1,     // a client is copying into it
  kStaged = 2,      // committed, waiting for the persister
  kPersisting = 3,  // being written to storage
  kDurable = 4,     // on storage; still restorable from memory
};
std::string_view SlotStateName(SlotState state);

inline constexpr uint32_t kMaxSlots = 16;
inline constexpr uint64_t kArenaMagic = 0x31414E4552415043ull;  // "CPARENA1"
inline constexpr uint32_t kArenaVersion = 1;
inline constexpr uint64_t kSlotAlign = 2ull << 20;

struct alignas(64) SlotControl {
  std::atomic<uint32_t> state;  // SlotState
  std::atomic<uint32_t> pid;    // writer or reader pid, 0 if none
  std::atomic<uint64_t> step;
  std::atomic<uint64_t> image_bytes;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct ArenaHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t num_slots;
  uint64_t slot_bytes;
  uint64_t slots_offset;
  uint64_t arena_bytes;
  uint32_t rank;
  uint32_t world_size;
  char job[128];
  uint64_t created_unix_ns;
  SlotControl slots[kMaxSlots];
};
static_assert(sizeof(ArenaHeader) <= 4096);

struct ArenaOptions {
  std::string name;  // shm_open name, "/ckptd.<...>"
  // A hugetlbfs directory (2 MiB pages) to make the segment in, as
  // huge_dir + name; empty: /dev/shm only. Create falls back to /dev/shm
  // when the segment cannot be made there (no free huge pages), unless
  // huge_required. Reattach looks there first, then in /dev/shm.
  std::string huge_dir;
  bool huge_required = false;
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint64_t slot_bytes = 0;  // rounded up to kSlotAlign
  uint32_t num_slots = 2;   // 2..kMaxSlots
  // The job's uid: may open the segment read-write (segment_access.h).
  // (uid_t)-1: only the daemon's uid.
  uid_t user_uid = static_cast<uid_t>(-1);
  // Slots whose pages Create allocates and faults in before returning
  // (zeroing shmem pages is the expensive part of creating an arena); the
  // others need ReserveSlots() before use.
  uint32_t prefault_slots = kMaxSlots;
  // The arena is made for the daemon to load a shard into slot 0 (a
  // restore after a restart, a fetch): where the segment's pages are
  // reserved without being faulted in (hugetlbfs, whose mmap reserves
  // every huge page of the segment, so a fault cannot find the pool
  // empty), slot 0's pages are left for the load's writes to fault in as
  // the bytes arrive, instead of all being zeroed before the first byte
  // is asked for. In /dev/shm only a reservation (which allocates the
  // pages) keeps a full /dev/shm from becoming a SIGBUS in the load, so
  // slot 0 is reserved and faulted in as prefault_slots says.
  bool slot0_faulted_by_load = false;
  // With slot0_faulted_by_load, in /dev/shm where the tmpfs gives no huge
  // pages (huge=never: the only pages a fault through the mapping could
  // get are the ones fallocate gets): slot 0 is reserved but not faulted
  // in, for a load that writes it through the segment's file
  // (slot_file(0), pwrite(2)). tmpfs then fills each page as the bytes
  // arrive, without zeroing it first and without a page fault each in the
  // daemon: the two costs of a fresh page, which a load that overwrites
  // the whole slot does not need. Unset, or where /dev/shm may give huge
  // pages (an advised fault gets them, a write does not), slot 0 is
  // faulted in as slot0_faulted_by_load says.
  bool slot0_written_through_file = false;
};

class Arena {
 public:
  ~Arena();  // Unmaps; never unlinks.

  // Daemon: creates a new arena (fails AlreadyExists if the name exists).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Arena>> Create(
      const ArenaOptions& options);
  // Daemon after a restart: maps an existing arena read-write and checks
  // that its header matches `expect` (job, rank, slot_bytes, num_slots) and
  // the segment's size; DataLoss naming the field if it was scribbled over.
  // PermissionDenied, changing nothing, unless the segment is the daemon's
  // (or expect.user_uid's) and closed to everyone else: anyone can create
  // a file under that name. An accepted one is made the daemon's again.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Arena>> Reattach(
      const ArenaOptions& expect);
  // Client: maps an arena the daemon handed out. Header read-only, slots
  // read-write. PermissionDenied unless the segment is root's (ckptd's) or
  // the caller's own, and closed to everyone else.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Arena>> Attach(
      std::string_view name, uint64_t arena_bytes, uint64_t slots_offset);
  // Removes the name (the memory lives until every mapping is gone). Either
  // form: a shared-memory name or a hugetlbfs path.
  [[nodiscard]] static absl::Status Unlink(std::string_view name);
  // Daemon: gives this arena the name `to`, atomically replacing an arena
  // of that name (whose mappings stay valid). For an arena that no other
  // thread uses yet: it changes name().
  [[nodiscard]] absl::Status Rename(std::string_view to);
  // Daemon: allocates (if Create left them out) and faults in the pages of
  // slots [first, first + count); ResourceExhausted if /dev/shm has no room
  // left. Safe to run on another thread while other slots are in use.
  [[nodiscard]] absl::Status ReserveSlots(uint32_t first, uint32_t count) const;

  // Bytes an arena of these dimensions occupies, and the offset of slot 0.
  static uint64_t SlotsOffset();
  static uint64_t ArenaBytes(uint64_t slot_bytes, uint32_t num_slots);

  // The segment's name: "/<name>" in /dev/shm, or a hugetlbfs file's path.
  const std::string& name() const { return name_; }
  // Whether the segment is backed by 2 MiB pages (on hugetlbfs).
  bool huge_pages() const { return huge_pages_; }
  // The daemon's descriptor of the segment, for writing slot `slot`
  // through the file (pwrite at slot_offset(slot)) instead of through the
  // mapping, when the slot was left for that (slot_left_to_file); -1 in
  // a client's mapping. Valid while the Arena lives.
  int slot_file() const { return segment_fd_; }
  // Whether Create left `slot` reserved but not faulted in, for a load
  // through the file (ArenaOptions::slot0_written_through_file).
  bool slot_left_to_file(uint32_t slot) const {
    return slot == 0 && slot0_left_to_file_;
  }
  // Create with a huge_dir that fell back to /dev/shm: why; else empty.
  const std::string& huge_fallback() const { return huge_fallback_; }
  uint64_t size() const { return size_; }
  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t slot_offset(uint32_t slot) const;
  char* slot_data(uint32_t slot) const;
  char* base() const { return base_; }
  const ArenaHeader& header() const {
    return *reinterpret_cast<const ArenaHeader*>(base_);
  }

  // Daemon: OK while the segment keeps its size and no access faulted;
  // else DataLoss naming the arena (its slots are lost for good: the
  // daemon's mapping of it now reads zeros). Run it after reading or
  // writing a slot; a read from a failed arena must not be trusted.
  [[nodiscard]] absl::Status CheckIntact() const;

  // Daemon only (the client's header mapping is read-only).
  void SetSlotState(uint32_t slot, SlotState state, uint64_t step, uint32_t pid,
                    uint64_t image_bytes);
  SlotState slot_state(uint32_t slot) const;

 private:
  Arena() = default;
  static absl::StatusOr<std::unique_ptr<Arena>> CreateAt(
      const ArenaOptions& options, const std::string& name);
  static absl::StatusOr<std::unique_ptr<Arena>> ReattachAt(
      const ArenaOptions& expect, const std::string& name);
  // The daemon's read-write view of a mapped arena.
  static std::unique_ptr<Arena> Wrap(std::string name, char* base,
                                     uint64_t size, uint64_t slot_bytes,
                                     uint32_t num_slots, int segment_fd,
                                     TruncationGuard guard);
  std::string name_;
  char* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t slots_offset_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t num_slots_ = 0;
  bool header_writable_ = false;
  bool huge_pages_ = false;
  std::string huge_fallback_;
  int fd_ = -1;          // Create's segment while slots are left to reserve
  int segment_fd_ = -1;  // the daemon's, for CheckIntact
  bool slot0_left_to_file_ = false;
  TruncationGuard guard_;  // the daemon's mapping
};

}  // namespace ckpt::shm

#endif  // CKPT_SHM_ARENA_H_
