// One process per directory: a daemon's root (ckptd --root) or state
// (ckpt-coordinator --state) is locked with flock(2) on a file in it, which
// the kernel releases when the holder exits, however it exits. The file
// holds the holder's pid, so a second process is refused naming who has it
// (RocksDB's own LOCK would say only "Resource temporarily unavailable").
#ifndef CKPT_UTIL_DIR_LOCK_H_
#define CKPT_UTIL_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

class DirLock {
 public:
  DirLock(DirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirLock& operator=(DirLock&&) = delete;
  DirLock(const DirLock&) = delete;
  ~DirLock();

  // Locks `dir` (which must exist) for `program`, e.g. "ckptd". Refused,
  // FAILED_PRECONDITION: "<dir>: in use by <program> pid <N> (...); stop it
  // or give this one another <field>" (the caller names the field first).
  [[nodiscard]] static absl::StatusOr<DirLock> Acquire(
      const std::string& dir, const std::string& program,
      const std::string& field);

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace ckpt

#endif  // CKPT_UTIL_DIR_LOCK_H_
