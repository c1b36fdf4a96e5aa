// DaemonProcess: a ckptd child process for the benchmark, on its own
// socket, root and shared-memory prefix, with its log in a file. Start()
// returns once the daemon answers a Status RPC; Stop() sends SIGTERM and
// waits for it to drain and exit. The destructor stops a running daemon.
// Not thread-safe.
#ifndef CKPT_BENCH_DAEMON_PROCESS_H_
#define CKPT_BENCH_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct DaemonConfig {
  std::string binary;  // path of ckptd
  std::string socket;
  std::string root;
  std::string shm_prefix;
  std::string log_path;  // stdout and stderr of the daemon (appended)
  std::vector<std::string> extra_args;  // more ckptd flags (e.g. --object-url)
  std::chrono::seconds start_timeout{20};
};

class DaemonProcess {
 public:
  explicit DaemonProcess(DaemonConfig config) : config_(std::move(config)) {}
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  [[nodiscard]] absl::Status Start();
  // SIGTERM, then waits (the daemon drains pending persists first).
  [[nodiscard]] absl::Status Stop();
  // From the Status RPC: the storage backend and the shm name of every
  // arena the daemon holds.
  struct State {
    std::string backend;
    std::vector<std::string> arenas;
    uint32_t persist_queue = 0;    // persists, manifests and deletes waiting
    uint64_t bytes_in_flight = 0;  // staged or persisting, not yet durable
    uint32_t upload_backlog_shards = 0;  // object tier: not uploaded yet
    std::string last_upload_error;
  };
  [[nodiscard]] absl::StatusOr<State> Query() const;
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

 private:
  DaemonConfig config_;
  pid_t pid_ = -1;
};

// ../daemon/ckptd relative to the directory of the running executable.
std::string DefaultCkptdPath();

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_DAEMON_PROCESS_H_
