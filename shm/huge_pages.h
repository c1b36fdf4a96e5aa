// Whether shared memory in a directory gets transparent huge pages: the
// huge= option of the tmpfs that holds it and the system-wide
// shmem_enabled override (doc/operations.md "Huge pages for the arenas").
// ckptd's shm health check names a directory without them; the
// benchmarks print it beside their figures. And private memory in the
// same 2 MiB pages (replica copies; the benchmarks' limits). Functions
// only; thread-safe.
#ifndef CKPT_SHM_HUGE_PAGES_H_
#define CKPT_SHM_HUGE_PAGES_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt::shm {

// From the text of /proc/self/mountinfo and of
// /sys/kernel/mm/transparent_hugepage/shmem_enabled: "on: huge=advise"
// (ckptd advises its mappings), "off: /dev/shm is mounted huge=never", or
// "unknown" (not a tmpfs, or no mount holds `dir`).
std::string ShmHugePages(std::string_view mountinfo,
                         std::string_view shmem_enabled, std::string_view dir);

// The same for `dir` on this machine, now.
std::string ShmHugePagesOf(const std::string& dir);

// The mount point of the first hugetlbfs in `mountinfo` (the text of
// /proc/self/mountinfo) whose pages are 2 MiB (pagesize=2M, or no
// pagesize option where the system's default huge page is 2 MiB, as
// `default_2m` says); empty if none.
std::string FindHugetlbfs(std::string_view mountinfo, bool default_2m);
// The same on this machine, now.
std::string FindHugetlbfsOf();

// OK if `dir` is a directory on a hugetlbfs of 2 MiB pages; else
// InvalidArgument naming `dir`.
absl::Status CheckHugetlbfsDir(const std::string& dir);

// Private anonymous memory of `bytes`, 2 MiB-aligned and advised for
// transparent huge pages (THP "madvise" or "always"; mere advice
// otherwise): one fault and one page-table entry per 2 MiB instead of per
// 4 KiB. Not faulted in. munmap(p, bytes) lets go of it. MAP_FAILED when
// it cannot be mapped (errno set).
void* MapHugeAnonymous(uint64_t bytes);

}  // namespace ckpt::shm

#endif  // CKPT_SHM_HUGE_PAGES_H_
