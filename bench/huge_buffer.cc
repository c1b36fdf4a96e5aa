#include "bench/huge_buffer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
