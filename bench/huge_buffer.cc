#include "bench/huge_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "shm/huge_pages.h"
#include "util/status.h"

namespace ckpt::bench {

absl::StatusOr<HugeBuffer> HugeBuffer::Make(uint64_t bytes, char fill) {
  const uint64_t size = std::max<uint64_t>(bytes, 1);
  void* p = shm::MapHugeAnonymous(size);
  if (p == MAP_FAILED)
    return ErrnoToStatus(errno, absl::StrCat("mapping ", size, " bytes"));
  std::memset(p, fill, size);  // faulted in: the measurement alone is timed
  return HugeBuffer(static_cast<char*>(p), size);
}

absl::StatusOr<HugeBuffer> HugeBuffer::MakeLikeArena(uint64_t bytes, char fill,
                                                     bool fault_in) {
  const uint64_t size = std::max<uint64_t>(bytes, 1);
  // Where ckptd would put its arenas on hugetlbfs (its default, --huge-pages
  // auto), the limit's memory is there too when the pool holds it: 2 MiB
  // pages against 2 MiB pages.
  constexpr uint64_t kHuge = 2ull << 20;
  const uint64_t huge_size = (size + kHuge - 1) / kHuge * kHuge;
  if (const std::string dir = shm::FindHugetlbfsOf(); !dir.empty()) {
    const std::string path = absl::StrCat(dir, "/ckpt-bench-limit-", getpid());
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::unlink(path.c_str());
      void* p = ::mmap(nullptr, huge_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                       fd, 0);  // ENOMEM: the pool is short; /dev/shm then
      ::close(fd);
      if (p != MAP_FAILED) {
        if (fault_in) std::memset(p, fill, huge_size);
        return HugeBuffer(static_cast<char*>(p), huge_size);
      }
    }
  }
  const std::string name = absl::StrCat("/ckpt-bench-limit-", getpid());
  int fd =
      ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
  ::shm_unlink(name.c_str());  // the mapping keeps the pages
  void* p = MAP_FAILED;
  int err = 0;
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
    err = errno;
  else if ((p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       0)) == MAP_FAILED)
    err = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    return ErrnoToStatus(err, absl::StrCat("mapping ", size, " bytes of ", name,
                                           " in /dev/shm"));
  (void)::madvise(p, size, MADV_HUGEPAGE);  // the arenas' advice
  // Faulted in: the measurement alone is timed.
  if (fault_in) std::memset(p, fill, size);
  return HugeBuffer(static_cast<char*>(p), size);
}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

HugeBuffer::~HugeBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace ckpt::bench
