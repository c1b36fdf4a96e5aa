// A descriptor closed when it goes out of scope (private to shm/: the
// arena's and the beacon's segments).
#ifndef CKPT_SHM_SCOPED_FD_H_
#define CKPT_SHM_SCOPED_FD_H_

#include <unistd.h>

namespace ckpt::shm {

struct ScopedFd {
  int fd = -1;
  ScopedFd() = default;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace ckpt::shm

#endif  // CKPT_SHM_SCOPED_FD_H_
