// What /proc/self/smaps says about the mapping that holds an address: the
// tests' way to see whether memory is in huge pages (ShmemPmdMapped,
// AnonHugePages), which page-fault counts cannot show under ASan (its
// shadow memory faults too).
#ifndef CKPT_TESTS_SMAPS_H_
#define CKPT_TESTS_SMAPS_H_

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

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SMAPS_H_
