// What /proc/self/smaps says about the mapping that holds an address: the
// tests' way to see whether memory is in huge pages (ShmemPmdMapped,
// AnonHugePages), which page-fault counts cannot show under ASan (its
// shadow memory faults too).
#ifndef CKPT_TESTS_SMAPS_H_
#define CKPT_TESTS_SMAPS_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ckpt::testing {

// kB of `field` ("AnonHugePages") for the mapping that holds `addr`; -1 if
// no mapping does.
inline long SmapsKb(const void* addr, const char* field) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return -1;
  const auto at = reinterpret_cast<unsigned long>(addr);
  char line[512];
  bool in = false;
  long kb = -1;
  const size_t flen = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
      in = lo <= at && at < hi;
      continue;
    }
    if (in && std::strncmp(line, field, flen) == 0 && line[flen] == ':') {
      kb = std::strtol(line + flen + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return kb;
}

// 4 KiB pages of [p, p + bytes) that are in this process's page tables
// (/proc/self/pagemap's present bit): faulted in here, as opposed to
// allocated in a file that p maps (mincore says that). -1 if pagemap
// cannot be read.
inline long PresentPages(const void* p, uint64_t bytes) {
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / 4096;
  long n = 0;
  for (uint64_t i = 0; i < bytes / 4096; ++i) {
    uint64_t e = 0;
    if (::pread(fd, &e, sizeof e, static_cast<off_t>((first + i) * 8)) != 8) {
      n = -1;
      break;
    }
    n += (e >> 63) & 1;
  }
  ::close(fd);
  return n;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SMAPS_H_
