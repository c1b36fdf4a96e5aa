#include "shm/arena_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shm/arena.h"
#include "util/status.h"

namespace ckpt::shm {
namespace {

// Reserves every page of the segment so that running out of /dev/shm is an
// error now, never a SIGBUS on a later store. Never changes the segment's
// size: one the job's uid truncated stays truncated (and its loss seen,
// Arena::CheckIntact) rather than grown back full of zeros.
absl::Status Reserve(int fd, const std::string& name, uint64_t offset,
                     uint64_t bytes) {
  int err = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                        static_cast<off_t>(bytes)) == 0
                ? 0
                : errno;
  if (err == 0) return absl::OkStatus();
  if (err == ENOSPC || err == EFBIG) {
    struct statvfs vfs {};
    uint64_t free_bytes =
        ::fstatvfs(fd, &vfs) == 0 ? uint64_t{vfs.f_bavail} * vfs.f_frsize : 0;
    return absl::ResourceExhaustedError(
        absl::StrCat("arena ", name, ": /dev/shm cannot hold ", bytes,
                     " bytes (free: ", free_bytes, ")"));
  }
  return ErrnoToStatus(
      err, absl::StrCat("arena ", name, ": posix_fallocate ", bytes, " bytes"));
}

// Faults every page of [base, base + bytes) in with MADV_POPULATE_WRITE, on
// several threads: the first touch of a shmem page (zeroing it) is the
// expensive part of creating an arena, and a first save must not pay it
// page by page. Returns the first errno (EINVAL: a kernel before 5.14;
// EFAULT: a page could not be allocated), 0 if all went in.
int Populate(char* base, uint64_t bytes) {
  unsigned n = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  // Whole 2 MiB pieces, so that no huge page is split between threads.
  const uint64_t want = bytes / n + 1;
  const uint64_t per = (want + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
  std::vector<std::thread> threads;
  std::vector<int> errs(n, 0);
  for (unsigned i = 0; i < n; ++i) {
    uint64_t off = i * per;
    if (off >= bytes) break;
    uint64_t len = std::min(per, bytes - off);
    threads.emplace_back([&, i, off, len] {
      if (::madvise(base + off, len, MADV_POPULATE_WRITE) != 0) errs[i] = errno;
    });
  }
  for (auto& t : threads) t.join();
  for (int err : errs)
    if (err) return err;
  return 0;
}

}  // namespace

absl::Status ReserveOnly(int fd, uint64_t offset, uint64_t bytes,
                         const std::string& name) {
  return Reserve(fd, name, offset, bytes);
}

void AdviseHugePages(char* base, uint64_t bytes) {
  (void)::madvise(base, bytes, MADV_HUGEPAGE);
}

absl::Status ReserveAndPrefault(int fd, char* base, uint64_t offset,
                                uint64_t bytes, const std::string& name,
                                bool fresh) {
  AdviseHugePages(base + offset, bytes);
  int err = Populate(base + offset, bytes);
  if (fd >= 0) {
    if (absl::Status r = Reserve(fd, name, offset, bytes); !r.ok()) {
      if (fresh)
        (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          static_cast<off_t>(offset),
                          static_cast<off_t>(bytes));
      return r;
    }
  }
  if (err == EFAULT) err = Populate(base + offset, bytes);  // room now
  if (err == EINVAL) {
    // Kernels before 5.14: write each page's first byte back as it is (a
    // re-attached arena holds staged shards; the pages are reserved above).
    volatile char* at = base + offset;
    for (uint64_t p = 0; p < bytes; p += 4096) at[p] = at[p];
    err = 0;
  }
  if (err != 0)
    return ErrnoToStatus(err, absl::StrCat("arena ", name, ": pre-fault"));
  return absl::OkStatus();
}

}  // namespace ckpt::shm
