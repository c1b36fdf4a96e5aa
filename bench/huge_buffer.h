// Memory for the benchmarks' limits, in the pages ckptd's own memory gets.
#ifndef CKPT_BENCH_HUGE_BUFFER_H_
#define CKPT_BENCH_HUGE_BUFFER_H_

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"

namespace ckpt::bench {

// Memory for a limit's measurement: `bytes`, faulted in (every byte
// `fill`), in the pages ckptd's arenas and replica copies get (2 MiB where
// transparent huge pages allow: shm::MapHugeAnonymous). A limit measured
// into 4 KiB pages while ckptd's path uses 2 MiB ones compares page tables,
// not the copy: on a virtualized host a memcpy, a socket receive or an
// O_DIRECT read into 4 KiB pages ran 2-20x slower. Move-only.
class HugeBuffer {
 public:
  static absl::StatusOr<HugeBuffer> Make(uint64_t bytes, char fill = 0);
  // The same, backed as ckptd's arenas are: a /dev/shm segment (unlinked
  // once mapped) with the arenas' huge-page advice, so its pages are the
  // size an arena's slot gets on this machine. Private anonymous memory
  // may get 2 MiB pages where /dev/shm gives 4 KiB ones (THP "madvise"
  // with a tmpfs mounted huge=never): an O_DIRECT write from it is then
  // a limit ckptd's persist, which writes from the arena, cannot reach.
  // Where a hugetlbfs of 2 MiB pages is mounted and its pool holds the
  // buffer, it is a file there instead, as ckptd's arenas are then (its
  // size rounded up to 2 MiB).
  // fault_in false leaves every page to be faulted in by the first write,
  // as a freshly created arena's are.
  static absl::StatusOr<HugeBuffer> MakeLikeArena(uint64_t bytes, char fill = 0,
                                                  bool fault_in = true);
  HugeBuffer() = default;  // empty
  HugeBuffer(HugeBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;
  ~HugeBuffer();
  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  HugeBuffer(char* data, uint64_t size) : data_(data), size_(size) {}
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_HUGE_BUFFER_H_
