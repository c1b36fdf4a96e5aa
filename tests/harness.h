// Test harness: temporary directories and a real ckptd process on a
// temporary socket, with its own shared-memory prefix, that tests can kill
// with real signals and restart on the same root.
#ifndef CKPT_TESTS_HARNESS_H_
#define CKPT_TESTS_HARNESS_H_

#include <sys/types.h>

#include <memory>
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
// A prefix unique to this test process and call.
std::string UniqueShmPrefix();

ClientOptions OptionsFor(const DaemonProcess& d, const std::string& job,
                         int rank, int world_size);

// Host tensors with deterministic contents derived from (seed, name).
struct HostState {
  std::vector<std::vector<char>> buffers;
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
