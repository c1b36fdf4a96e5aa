// How an arena's pages are allocated and faulted in (shm/arena.cc's
// helper): huge pages where the tmpfs allows them, reserved so that a full
// /dev/shm is an error now and never a SIGBUS later. Internal to ckpt_shm.
#ifndef CKPT_SHM_ARENA_PAGES_H_
#define CKPT_SHM_ARENA_PAGES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ckpt::shm {

// Asks for transparent huge pages on [base, base + bytes). Where the
// tmpfs allows them (mounted huge=within_size or always, or huge=advise
// with this advice), a slot is 2 MiB pages: every process that maps the
// arena fills one page-table entry per 2 MiB instead of 512, which is most
// of what a first copy through a new mapping costs (doc/operations.md
// "Huge pages"). Advice only: a kernel or mount without them ignores it.
void AdviseHugePages(char* base, uint64_t bytes);

// Allocates and faults in [offset, offset + bytes) of the segment `fd`,
// mapped at `base` (`fd` < 0: the pages are allocated already). The pages
// are faulted in through the mapping first and reserved (fallocate) after:
// on a huge=advise tmpfs a fault through an advised mapping allocates huge
// pages where fallocate would allocate small ones. Running out of room is
// ResourceExhausted, never a SIGBUS (MADV_POPULATE_WRITE reports EFAULT);
// with `fresh` (the range holds nothing yet), the pages the faults got are
// given back then. Never changes a byte the range holds.
[[nodiscard]] absl::Status ReserveAndPrefault(int fd, char* base,
                                              uint64_t offset, uint64_t bytes,
                                              const std::string& name,
                                              bool fresh);

// Reserves [offset, offset + bytes) of the /dev/shm segment `fd`
// (fallocate) without faulting a page in: running out of room is
// ResourceExhausted now. tmpfs allocates the pages without zeroing them; a
// page is zeroed when first faulted in through a mapping, not when first
// written with pwrite(2), which fills it instead. Never changes the
// segment's size.
[[nodiscard]] absl::Status ReserveOnly(int fd, uint64_t offset, uint64_t bytes,
                                       const std::string& name);

}  // namespace ckpt::shm

#endif  // CKPT_SHM_ARENA_PAGES_H_
