#include "shm/arena.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "shm/arena_pages.h"
#include "shm/huge_pages.h"
#include "shm/scoped_fd.h"
#include "shm/segment_access.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::shm {

namespace bip = boost::interprocess;

namespace {

constexpr uint64_t kHeaderBytes = 4096;

uint64_t RoundUp(uint64_t n, uint64_t align) {
  return (n + align - 1) / align * align;
}

// Boost reports failures as exceptions; this is the one place they become a
// Status (its native error is the errno of the failed call).
absl::Status BoostToStatus(const bip::interprocess_exception& e,
                           std::string_view context) {
  int err = e.get_native_error();
  if (err != 0) return ErrnoToStatus(err, context);
  if (e.get_error_code() == bip::already_exists_error)
    return absl::AlreadyExistsError(absl::StrCat(AV(context), ": ", e.what()));
  if (e.get_error_code() == bip::not_found_error)
    return absl::NotFoundError(absl::StrCat(AV(context), ": ", e.what()));
  return absl::InternalError(absl::StrCat(AV(context), ": ", e.what()));
}

// A name with a second '/' is the path of a file on hugetlbfs; one
// without is a POSIX shared-memory name (a file of /dev/shm).
bool IsPathName(std::string_view name) {
  return name.find('/', 1) != std::string_view::npos;
}

std::string SegmentPath(const std::string& name) {
  return IsPathName(name) ? name : "/dev/shm" + name;
}

absl::Status ValidateName(std::string_view name) {
  bool ok = name.size() >= 2 && name.size() <= 4095 && name[0] == '/';
  // Every component 1..255 characters, none "." or "..".
  for (size_t at = 1; ok;) {
    const size_t end = std::min(name.find('/', at), name.size());
    const std::string_view part = name.substr(at, end - at);
    ok = !part.empty() && part.size() <= 255 && part != "." && part != "..";
    if (end == name.size()) break;
    at = end + 1;
  }
  if (!ok)
    return absl::InvalidArgumentError(absl::StrCat(
        "arena name \"", AV(name),
        "\": must be '/' followed by 1 to 254 characters without '/', or an "
        "absolute path without empty, . or .. components"));
  return absl::OkStatus();
}

bool OnHugetlbfs(int fd) {
  struct statfs fs {};
  return ::fstatfs(fd, &fs) == 0 &&
         static_cast<uint64_t>(fs.f_type) == HUGETLBFS_MAGIC;
}

// Opens a hugetlbfs path the way OpenSegment opens a shared-memory name;
// FailedPrecondition if the file is on another file system (an arena's
// path must never name an ordinary file).
absl::StatusOr<int> OpenPathSegment(const std::string& path, bool create,
                                    bool writable) {
  int flags = (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW;
  if (create) flags |= O_CREAT | O_EXCL;
  ScopedFd fd;
  fd.fd = ::open(path.c_str(), flags, 0600);
  if (fd.fd < 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", path, ": open"));
  if (!OnHugetlbfs(fd.fd)) {
    if (create) (void)::unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", path, ": not a file on hugetlbfs"));
  }
  return std::exchange(fd.fd, -1);
}

// Checks the options of Create/Reattach and returns the rounded slot size.
absl::StatusOr<uint64_t> ValidateOptions(const ArenaOptions& o) {
  CKPT_RETURN_IF_ERROR(ValidateName(o.name));
  CKPT_RETURN_IF_ERROR(ValidateJobName(o.job, "arena job"));
  if (o.num_slots < 2 || o.num_slots > kMaxSlots)
    return absl::InvalidArgumentError(
        absl::StrCat("arena ", o.name, ": num_slots ", o.num_slots,
                     " not in [2, ", kMaxSlots, "]"));
  if (o.world_size == 0 || o.rank >= o.world_size)
    return absl::InvalidArgumentError(
        absl::StrCat("arena ", o.name, ": rank ", o.rank,
                     " not in [0, world_size ", o.world_size, ")"));
  constexpr uint64_t kMaxSlotBytes = uint64_t{1}
                                     << 48;  // 256 TiB: far beyond any node
  if (o.slot_bytes == 0 || o.slot_bytes > kMaxSlotBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "arena ", o.name, ": slot_bytes ", o.slot_bytes, " not in [1, 2^48]"));
  return RoundUp(o.slot_bytes, kSlotAlign);
}

// Opens (or with `create`, exclusively creates with mode 0600) the segment
// and returns a duplicate of its descriptor that the caller owns.
absl::StatusOr<int> OpenSegment(const std::string& name, bool create,
                                bool writable) {
  if (IsPathName(name)) return OpenPathSegment(name, create, writable);
  try {
    auto mode = writable ? bip::read_write : bip::read_only;
    std::optional<bip::shared_memory_object> shm;
    if (create) {
      shm.emplace(bip::create_only, name.c_str(), mode, bip::permissions(0600));
    } else {
      shm.emplace(bip::open_only, name.c_str(), mode);
    }
    int fd = ::fcntl(shm->get_mapping_handle().handle, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": dup"));
    return fd;
  } catch (const bip::interprocess_exception& e) {
    return BoostToStatus(e, absl::StrCat("arena ", name, ": shm_open"));
  }
}

absl::StatusOr<char*> Map(int fd, uint64_t offset, uint64_t bytes, int prot,
                          int flags, void* at, std::string_view what) {
  void* p = ::mmap(at, bytes, prot, flags, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return ErrnoToStatus(errno, what);
  return static_cast<char*>(p);
}

// Compares the header with what the caller expects; DataLoss names the field.
absl::Status CheckHeader(const ArenaHeader& h, const std::string& name,
                         const ArenaOptions* expect, uint64_t slot_bytes,
                         uint64_t arena_bytes) {
  auto mismatch = [&](std::string_view field, auto got, auto want) {
    return absl::DataLossError(absl::StrCat("arena ", name, ": header ",
                                            AV(field), " is ", got,
                                            ", expected ", want));
  };
  if (h.magic != kArenaMagic) return mismatch("magic", h.magic, kArenaMagic);
  if (h.version != kArenaVersion)
    return mismatch("version", h.version, kArenaVersion);
  if (h.slots_offset != kSlotAlign)
    return mismatch("slots_offset", h.slots_offset, kSlotAlign);
  if (h.arena_bytes != arena_bytes)
    return mismatch("arena_bytes", h.arena_bytes, arena_bytes);
  if (expect == nullptr) {
    // Client: the dimensions must at least describe this segment.
    if (h.num_slots < 2 || h.num_slots > kMaxSlots)
      return mismatch("num_slots", h.num_slots, "2..16");
    if (h.slot_bytes == 0 || h.slot_bytes % kSlotAlign != 0 ||
        h.slot_bytes > (arena_bytes - kSlotAlign) / h.num_slots)
      return mismatch("slot_bytes", h.slot_bytes,
                      "a 2 MiB multiple that fits the arena");
    return absl::OkStatus();
  }
  if (h.num_slots != expect->num_slots)
    return mismatch("num_slots", h.num_slots, expect->num_slots);
  if (h.slot_bytes != slot_bytes)
    return mismatch("slot_bytes", h.slot_bytes, slot_bytes);
  if (::strnlen(h.job, sizeof(h.job)) == sizeof(h.job) || expect->job != h.job)
    return mismatch(
        "job",
        absl::StrCat("\"", std::string(h.job, ::strnlen(h.job, sizeof(h.job))),
                     "\""),
        absl::StrCat("\"", expect->job, "\""));
  if (h.rank != expect->rank) return mismatch("rank", h.rank, expect->rank);
  return absl::OkStatus();
}

}  // namespace

std::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kWriting:
      return "writing";
    case SlotState::kStaged:
      return "staged";
    case SlotState::kPersisting:
      return "persisting";
    case SlotState::kDurable:
      return "durable";
  }
  return "invalid";
}

uint64_t Arena::SlotsOffset() { return kSlotAlign; }

uint64_t Arena::ArenaBytes(uint64_t slot_bytes, uint32_t num_slots) {
  return kSlotAlign + RoundUp(slot_bytes, kSlotAlign) * num_slots;
}

Arena::~Arena() {
  guard_.Release();  // before the range can be mapped by anything else
  if (base_ != nullptr) ::munmap(base_, size_);
  if (segment_fd_ >= 0) ::close(segment_fd_);
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(
    const ArenaOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options).status());
  if (options.huge_dir.empty()) return CreateAt(options, options.name);
  const std::string path = options.huge_dir + options.name;
  CKPT_RETURN_IF_ERROR(ValidateName(path));
  auto huge = CreateAt(options, path);
  if (huge.ok() || options.huge_required) return huge;
  // No free 2 MiB pages (or no access to the directory): small pages in
  // /dev/shm, saying why.
  auto small = CreateAt(options, options.name);
  if (small.ok())
    (*small)->huge_fallback_ = std::string(huge.status().message());
  return small;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::CreateAt(
    const ArenaOptions& options, const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(uint64_t slot_bytes, ValidateOptions(options));
  const uint64_t arena_bytes = ArenaBytes(slot_bytes, options.num_slots);
  ScopedFd fd;
  CKPT_ASSIGN_OR_RETURN(fd.fd,
                        OpenSegment(name, /*create=*/true, /*writable=*/true));
  absl::Status s = GrantSegment(fd.fd, name, options.user_uid);
  // Only the header and the first prefault_slots slots are reserved and
  // faulted in now; ReserveSlots() does the rest. The segment has its full
  // size from the start (clients check it), and /dev/shm must have room for
  // all of it now: a later reservation that fails leaves those slots
  // unused, never a SIGBUS.
  // On hugetlbfs the mmap below reserves every huge page of the segment
  // (ENOMEM when the pool is short), and statvfs describes the pool's
  // limit, if any, rather than free memory.
  const bool huge = IsPathName(name);
  uint32_t now_slots = std::min(options.prefault_slots, options.num_slots);
  if (huge && options.slot0_faulted_by_load) now_slots = 0;
  // Slot 0 reserved for a load through the file, not faulted in.
  const bool slot0_to_file =
      !huge && options.slot0_faulted_by_load &&
      options.slot0_written_through_file && now_slots >= 1 &&
      absl::StartsWith(ShmHugePagesOf("/dev/shm"), "off");
  const uint64_t now_bytes = kSlotAlign + slot_bytes * now_slots;
  if (s.ok() && ::ftruncate(fd.fd, static_cast<off_t>(arena_bytes)) != 0)
    s = ErrnoToStatus(errno, absl::StrCat("arena ", name, ": ftruncate ",
                                          arena_bytes, " bytes"));
  struct statvfs vfs {};
  if (s.ok() && !huge && ::fstatvfs(fd.fd, &vfs) == 0 &&
      uint64_t{vfs.f_bavail} * vfs.f_frsize < arena_bytes)
    s = absl::ResourceExhaustedError(absl::StrCat(
        "arena ", name, ": /dev/shm cannot hold ", arena_bytes,
        " bytes (free: ", uint64_t{vfs.f_bavail} * vfs.f_frsize, ")"));
  char* base = nullptr;
  TruncationGuard guard;
  if (s.ok()) {
    auto mapped =
        Map(fd.fd, 0, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, nullptr,
            absl::StrCat("arena ", name, ": mmap ", arena_bytes, " bytes"));
    if (mapped.ok()) {
      base = *mapped;
      // The job's uid may open the segment from now on.
      s = guard.Guard(base, arena_bytes, PROT_READ | PROT_WRITE,
                      absl::StrCat("arena ", name));
      if (s.ok() && slot0_to_file) {
        s = ReserveAndPrefault(fd.fd, base, 0, kSlotAlign, name,
                               /*fresh=*/true);
        if (s.ok()) s = ReserveOnly(fd.fd, kSlotAlign, slot_bytes, name);
        if (s.ok() && now_bytes > kSlotAlign + slot_bytes)
          s = ReserveAndPrefault(fd.fd, base, kSlotAlign + slot_bytes,
                                 now_bytes - kSlotAlign - slot_bytes, name,
                                 /*fresh=*/true);
      } else if (s.ok()) {
        s = ReserveAndPrefault(fd.fd, base, 0, now_bytes, name,
                               /*fresh=*/true);
      }
      if (!s.ok()) {
        guard.Release();
        ::munmap(base, arena_bytes);
      }
    } else {
      s = mapped.status();
      if (huge && absl::IsResourceExhausted(s))
        s = absl::ResourceExhaustedError(
            absl::StrCat("arena ", name, ": not enough free 2 MiB pages for ",
                         arena_bytes, " bytes (vm.nr_hugepages)"));
    }
  }
  if (!s.ok()) {
    (void)Unlink(name);  // the creation error is the one to report
    return s;
  }
  auto* h = new (base) ArenaHeader{};
  h->version = kArenaVersion;
  h->num_slots = options.num_slots;
  h->slot_bytes = slot_bytes;
  h->slots_offset = kSlotAlign;
  h->arena_bytes = arena_bytes;
  h->rank = options.rank;
  h->world_size = options.world_size;
  std::memcpy(h->job, options.job.data(), options.job.size());
  h->created_unix_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  for (auto& slot : h->slots)
    slot.state.store(static_cast<uint32_t>(SlotState::kFree));
  // The magic last: a header with the magic is complete.
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kArenaMagic;

  auto arena = Wrap(name, base, arena_bytes, slot_bytes, options.num_slots,
                    std::exchange(fd.fd, -1), std::move(guard));
  arena->huge_pages_ = huge;
  arena->slot0_left_to_file_ = slot0_to_file;
  if (now_bytes < arena_bytes)
    arena->fd_ = arena->segment_fd_;  // for ReserveSlots
  return arena;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Reattach(
    const ArenaOptions& expect) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(expect).status());
  if (!expect.huge_dir.empty()) {
    const std::string path = expect.huge_dir + expect.name;
    CKPT_RETURN_IF_ERROR(ValidateName(path));
    auto huge = ReattachAt(expect, path);
    if (!absl::IsNotFound(huge.status())) return huge;
  }
  return ReattachAt(expect, expect.name);
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::ReattachAt(
    const ArenaOptions& expect, const std::string& name) {
  CKPT_ASSIGN_OR_RETURN(uint64_t slot_bytes, ValidateOptions(expect));
  const uint64_t arena_bytes = ArenaBytes(slot_bytes, expect.num_slots);
  ScopedFd fd;
  CKPT_ASSIGN_OR_RETURN(fd.fd,
                        OpenSegment(name, /*create=*/false, /*writable=*/true));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fstat"));
  const uid_t self = ::geteuid();
  CKPT_RETURN_IF_ERROR(CheckSegmentOwner(
      st, name, self,
      expect.user_uid == static_cast<uid_t>(-1) ? self : expect.user_uid));
  const uint64_t real = static_cast<uint64_t>(st.st_size);
  if (real < kHeaderBytes)
    return absl::DataLossError(absl::StrCat("arena ", name,
                                            ": segment size is ", real,
                                            " bytes, expected ", arena_bytes));
  // Check the header through a small mapping before touching the slots
  // (one page: 2 MiB on hugetlbfs, which maps and unmaps whole pages).
  const uint64_t head_bytes =
      std::max<uint64_t>(kHeaderBytes, static_cast<uint64_t>(st.st_blksize));
  CKPT_ASSIGN_OR_RETURN(
      char* head, Map(fd.fd, 0, head_bytes, PROT_READ, MAP_SHARED, nullptr,
                      absl::StrCat("arena ", name, ": mmap header")));
  TruncationGuard head_guard;
  absl::Status s = head_guard.Guard(head, head_bytes, PROT_READ,
                                    absl::StrCat("arena ", name));
  if (s.ok())
    s = CheckHeader(*reinterpret_cast<const ArenaHeader*>(head), name, &expect,
                    slot_bytes, arena_bytes);
  if (s.ok() && head_guard.faulted())
    s = absl::DataLossError(
        absl::StrCat("arena ", name, ": segment truncated while read"));
  head_guard.Release();
  ::munmap(head, head_bytes);
  CKPT_RETURN_IF_ERROR(s);
  if (real != arena_bytes)
    return absl::DataLossError(absl::StrCat("arena ", name,
                                            ": segment size is ", real,
                                            " bytes, expected ", arena_bytes));
  // An older daemon gave its arenas to the job's uid (which logind's
  // RemoveIPC deletes); from now on it is ours.
  CKPT_RETURN_IF_ERROR(GrantSegment(fd.fd, name, expect.user_uid));
  CKPT_ASSIGN_OR_RETURN(
      char* base,
      Map(fd.fd, 0, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, nullptr,
          absl::StrCat("arena ", name, ": mmap ", arena_bytes, " bytes")));
  // Advised before the page tables are filled, so that huge pages are
  // mapped as such; the daemon that created it may have died before
  // reserving every slot.
  TruncationGuard guard;
  absl::Status p = guard.Guard(base, arena_bytes, PROT_READ | PROT_WRITE,
                               absl::StrCat("arena ", name));
  if (p.ok())
    p = ReserveAndPrefault(fd.fd, base, 0, arena_bytes, name,
                           /*fresh=*/false);
  if (!p.ok()) {
    guard.Release();
    ::munmap(base, arena_bytes);
    return p;
  }
  const bool huge = OnHugetlbfs(fd.fd);
  auto arena = Wrap(name, base, arena_bytes, slot_bytes, expect.num_slots,
                    std::exchange(fd.fd, -1), std::move(guard));
  arena->huge_pages_ = huge;
  return arena;
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::Attach(std::string_view name_view,
                                                     uint64_t arena_bytes,
                                                     uint64_t slots_offset) {
  std::string name(name_view);
  CKPT_RETURN_IF_ERROR(ValidateName(name));
  if (slots_offset != kSlotAlign || arena_bytes <= slots_offset)
    return absl::InvalidArgumentError(absl::StrCat(
        "arena ", name, ": slots_offset ", slots_offset, " / arena_bytes ",
        arena_bytes, " do not describe an arena"));
  ScopedFd fd;
  CKPT_ASSIGN_OR_RETURN(fd.fd,
                        OpenSegment(name, /*create=*/false, /*writable=*/true));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": fstat"));
  // ckptd runs as root; one run by the caller's own uid makes its arenas
  // the caller's.
  CKPT_RETURN_IF_ERROR(CheckSegmentOwner(st, name, 0, ::geteuid()));
  if (static_cast<uint64_t>(st.st_size) != arena_bytes)
    return absl::DataLossError(
        absl::StrCat("arena ", name, ": segment size is ", st.st_size,
                     " bytes, the daemon said ", arena_bytes));
  // One PROT_NONE reservation, then both parts mapped over it, so that the
  // read-only header and the writable slots sit at adjacent addresses. It
  // starts on a 2 MiB boundary: hugetlbfs maps only there, and transparent
  // huge pages need it too.
  CKPT_ASSIGN_OR_RETURN(
      char* raw, Map(-1, 0, arena_bytes + kSlotAlign, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, nullptr,
                     absl::StrCat("arena ", name, ": reserve address space")));
  char* base = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(raw) + kSlotAlign - 1) & ~(kSlotAlign - 1));
  if (base > raw) ::munmap(raw, static_cast<size_t>(base - raw));
  if (raw + kSlotAlign > base)
    ::munmap(base + arena_bytes, static_cast<size_t>(raw + kSlotAlign - base));
  absl::Status s =
      Map(fd.fd, 0, slots_offset, PROT_READ, MAP_SHARED | MAP_FIXED, base,
          absl::StrCat("arena ", name, ": mmap header"))
          .status();
  // Not populated: a trainer that only restores touches one slot, and a
  // restarted one must not wait for page tables of slots it never uses
  // (a copy faults its pages in on all copy threads at once).
  if (s.ok())
    s = Map(fd.fd, slots_offset, arena_bytes - slots_offset,
            PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, base + slots_offset,
            absl::StrCat("arena ", name, ": mmap slots"))
            .status();
  if (s.ok()) AdviseHugePages(base + slots_offset, arena_bytes - slots_offset);
  const auto* h = reinterpret_cast<const ArenaHeader*>(base);
  if (s.ok()) s = CheckHeader(*h, name, nullptr, 0, arena_bytes);
  if (!s.ok()) {
    ::munmap(base, arena_bytes);
    return s;
  }
  std::unique_ptr<Arena> arena(new Arena());
  arena->name_ = name;
  arena->base_ = base;
  arena->size_ = arena_bytes;
  arena->slots_offset_ = slots_offset;
  arena->slot_bytes_ = h->slot_bytes;
  arena->num_slots_ = h->num_slots;
  arena->header_writable_ = false;
  arena->huge_pages_ = OnHugetlbfs(fd.fd);
  return arena;
}

absl::Status Arena::Unlink(std::string_view name_view) {
  std::string name(name_view);
  CKPT_RETURN_IF_ERROR(ValidateName(name));
  if (IsPathName(name)) {
    if (::unlink(name.c_str()) != 0)
      return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": unlink"));
    return absl::OkStatus();
  }
  try {
    if (!bip::shared_memory_object::remove(name.c_str()))
      return ErrnoToStatus(errno, absl::StrCat("arena ", name, ": shm_unlink"));
  } catch (const bip::interprocess_exception& e) {
    return BoostToStatus(e, absl::StrCat("arena ", name, ": shm_unlink"));
  }
  return absl::OkStatus();
}

absl::Status Arena::Rename(std::string_view to_view) {
  std::string to(to_view);
  CKPT_RETURN_IF_ERROR(ValidateName(to));
  if (IsPathName(to))
    return absl::InvalidArgumentError(absl::StrCat(
        "arena ", name_, ": rename to ", to, ": a name, not a path"));
  // A hugetlbfs arena keeps its directory.
  if (IsPathName(name_)) to = name_.substr(0, name_.rfind('/')) + to;
  // POSIX shared memory objects are the files of /dev/shm on Linux (glibc's
  // shm_open opens "/dev/shm" + name); rename(2) replaces atomically.
  std::string from_path = SegmentPath(name_), to_path = SegmentPath(to);
  if (::rename(from_path.c_str(), to_path.c_str()) != 0)
    return ErrnoToStatus(errno,
                         absl::StrCat("arena ", name_, ": rename to ", to));
  name_ = std::move(to);
  return absl::OkStatus();
}

absl::Status Arena::ReserveSlots(uint32_t first, uint32_t count) const {
  if (first >= num_slots_) return absl::OkStatus();
  CKPT_RETURN_IF_ERROR(CheckIntact());
  count = std::min(count, num_slots_ - first);
  const uint64_t bytes = uint64_t{count} * slot_bytes_;
  return ReserveAndPrefault(fd_, base_, slot_offset(first), bytes, name_,
                            /*fresh=*/true);
}

uint64_t Arena::slot_offset(uint32_t slot) const {
  return slots_offset_ + uint64_t{slot} * slot_bytes_;
}

char* Arena::slot_data(uint32_t slot) const {
  return base_ + slot_offset(slot);
}

void Arena::SetSlotState(uint32_t slot, SlotState state, uint64_t step,
                         uint32_t pid, uint64_t image_bytes) {
  if (!header_writable_ || slot >= num_slots_) return;
  auto* h = reinterpret_cast<ArenaHeader*>(base_);
  SlotControl& c = h->slots[slot];
  c.step.store(step, std::memory_order_relaxed);
  c.pid.store(pid, std::memory_order_relaxed);
  c.image_bytes.store(image_bytes, std::memory_order_relaxed);
  c.state.store(static_cast<uint32_t>(state), std::memory_order_release);
}

SlotState Arena::slot_state(uint32_t slot) const {
  if (slot >= num_slots_) return SlotState::kFree;
  return static_cast<SlotState>(
      header().slots[slot].state.load(std::memory_order_acquire));
}

absl::Status Arena::CheckIntact() const {
  if (segment_fd_ < 0) return absl::OkStatus();  // a client's mapping
  struct stat st {};
  if (::fstat(segment_fd_, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("arena ", name_, ": fstat"));
  const bool resized = static_cast<uint64_t>(st.st_size) != size_;
  if (resized || guard_.faulted())
    return absl::DataLossError(absl::StrCat(
        "arena ", name_, ": segment truncated by another process (", st.st_size,
        " bytes, expected ", size_, "); the shards in its slots are lost"));
  return absl::OkStatus();
}

std::unique_ptr<Arena> Arena::Wrap(std::string name, char* base, uint64_t size,
                                   uint64_t slot_bytes, uint32_t num_slots,
                                   int segment_fd, TruncationGuard guard) {
  std::unique_ptr<Arena> arena(new Arena());
  arena->segment_fd_ = segment_fd;
  arena->guard_ = std::move(guard);
  arena->name_ = std::move(name);
  arena->base_ = base;
  arena->size_ = size;
  arena->slots_offset_ = kSlotAlign;
  arena->slot_bytes_ = slot_bytes;
  arena->num_slots_ = num_slots;
  arena->header_writable_ = true;
  return arena;
}

}  // namespace ckpt::shm
