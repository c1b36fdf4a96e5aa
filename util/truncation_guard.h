// TruncationGuard: makes the daemon survive another process truncating a
// file it has mapped MAP_SHARED (an arena's segment, which the job's uid
// may ftruncate).
//
// A CPU access to a page of such a mapping beyond the file's new end raises
// SIGBUS, in whichever thread touches it: a checksum pass, a memcpy inside
// a storage writer, a header store. Rather than guarding each of those
// accesses, a guarded range is repaired where it faults: one process-wide
// SIGBUS handler finds the faulting address in the table of guarded
// ranges, replaces the whole range with private zero pages (mmap
// MAP_FIXED, same protection) and marks it faulted; the faulting
// instruction then runs again on zeros, and so does every later access.
// The data is gone either way (the file no longer holds it), so the owner
// checks faulted() (arena.h: Arena::CheckIntact) after each use and fails
// what it read with an error naming the file. A SIGBUS outside every
// guarded range goes to the handler installed before this one, or takes
// the default action (a core dump): a real crash still crashes.
//
// The handler only loads atomics and calls mmap(2), sigaction(2) and
// raise(3) (mmap is a plain system call on Linux; it allocates nothing).
// A range must stay mapped while it is guarded: destroy the guard before
// unmapping (its owner's accesses keep it alive, so no fault can be in
// flight then). Thread-safety: Guard and the destructor may run
// concurrently with each other and with faults on other threads.
#ifndef CKPT_UTIL_TRUNCATION_GUARD_H_
#define CKPT_UTIL_TRUNCATION_GUARD_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

class TruncationGuard {
 public:
  // The most ranges guarded at once (a few per rank of every job on the
  // node).
  static constexpr int kMaxRanges = 4096;

  TruncationGuard() = default;
  TruncationGuard(TruncationGuard&& other) noexcept;
  TruncationGuard& operator=(TruncationGuard&& other) noexcept;
  TruncationGuard(const TruncationGuard&) = delete;
  TruncationGuard& operator=(const TruncationGuard&) = delete;
  ~TruncationGuard();  // Release()

  // Guards [base, base + bytes), a mapping with protection `prot`
  // (PROT_*). Installs the SIGBUS handler on first use. ResourceExhausted
  // naming `what` when kMaxRanges ranges are guarded already.
  [[nodiscard]] absl::Status Guard(void* base, size_t bytes, int prot,
                                   std::string_view what);
  // Stops guarding (before the range is unmapped).
  void Release();
  // Whether a SIGBUS in the range replaced it with zero pages.
  bool faulted() const;

 private:
  int index_ = -1;
};

}  // namespace ckpt

#endif  // CKPT_UTIL_TRUNCATION_GUARD_H_
