// Test harness: temporary directories and a real ckptd process on a
// temporary socket, with its own shared-memory prefix, that tests can kill
// with real signals and restart on the same root.
#ifndef CKPT_TESTS_HARNESS_H_
#define CKPT_TESTS_HARNESS_H_

#include <sys/types.h>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt.grpc.pb.h"
#include "ckpt/client.h"
#include "tests/temp_dir.h"  // TempDir, for the tests that use this harness

namespace ckpt::testing {

class DaemonProcess {
 public:
  // Starts ckptd --socket <dir>/ckptd.sock --root <root> and waits until the
  // socket accepts connections.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& root, const std::string& run_dir,
      const std::string& shm_prefix, std::vector<std::string> extra_args = {});
  ~DaemonProcess();  // SIGKILL if still running

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }
  void Kill(int sig);
  // Waits for exit; returns the wait status.
  int Wait();
  // Without waiting: whether it has exited (then *status is its wait
  // status, and the process is reaped).
  bool Exited(int* status);
  bool running() const { return pid_ > 0; }

  std::unique_ptr<v1::Ckptd::Stub> Stub() const;

 private:
  pid_t pid_ = -1;
  std::string socket_;
};

// Removes every /dev/shm entry whose name starts with prefix.
void UnlinkArenas(const std::string& shm_prefix);
// Flips one bit of the first tensor's first byte in the shard file at
// `path`, as bit rot would: the header and index stay valid, the tensor's
// checksum no longer matches.
void FlipFirstTensorByteOfFile(const std::string& path);
// A prefix unique to this test process and call.
std::string UniqueShmPrefix();
// Hands out UniqueShmPrefix()es and unlinks every arena under them when it
// goes (a killed ckptd leaves its arenas, by design). Declare it before
// the daemons that use its prefixes, so that it outlives them.
class ArenaPrefixes {
 public:
  ArenaPrefixes() = default;
  ArenaPrefixes(const ArenaPrefixes&) = delete;
  ArenaPrefixes& operator=(const ArenaPrefixes&) = delete;
  ~ArenaPrefixes() {
    for (const std::string& p : prefixes_) UnlinkArenas(p);
  }
  std::string New() {
    prefixes_.push_back(UniqueShmPrefix());
    return prefixes_.back();
  }

 private:
  std::vector<std::string> prefixes_;
};

ClientOptions OptionsFor(const DaemonProcess& d, const std::string& job,
                         int rank, int world_size);

// Memory for the tests' host tensors: 2 MiB or more in transparent huge
// pages (shm::MapHugeAnonymous), as ckptd's arenas are; less from the heap.
// A real trainer restores into memory it holds already (device memory, a
// framework's pooled host memory); a stand-in that faults in fresh 4 KiB
// pages at each start measures the host's page tables instead (2.5 s for
// four 256 MiB states at once on a 2-core VM, in recovery_bench).
// (Its large blocks: nullptr when they cannot be mapped.)
void* MapTensorMemory(size_t bytes);
void UnmapTensorMemory(void* p, size_t bytes);
template <class T>
struct TensorAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t{2} << 20;
  TensorAllocator() = default;
  template <class U>
  TensorAllocator(const TensorAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    if (n * sizeof(T) < kHuge) return std::allocator<T>().allocate(n);
    void* p = MapTensorMemory(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) {
    if (n * sizeof(T) < kHuge) return std::allocator<T>().deallocate(p, n);
    UnmapTensorMemory(p, n * sizeof(T));
  }
  template <class U>
  bool operator==(const TensorAllocator<U>&) const {
    return true;
  }
};
using TensorBytes = std::vector<char, TensorAllocator<char>>;

// Host tensors with deterministic contents derived from (seed, name).
struct HostState {
  std::vector<TensorBytes> buffers;
  std::vector<Tensor> tensors;
  // Same names, dtypes and shapes; zeroed buffers.
  HostState EmptyLike() const;
  bool Equals(const HostState& other) const;
  uint64_t bytes() const;
};
HostState MakeState(uint64_t total_bytes, int num_tensors, uint32_t seed);
// The same names, dtypes and shapes as MakeState, zeroed.
HostState MakeEmptyState(uint64_t total_bytes, int num_tensors);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_HARNESS_H_
