// StorageThrottle: recovery_bench's --storage-gbit. On this machine the
// "shared root" is a directory on the local disk, which reads as fast as
// the host's cache serves it (GB/s); a job's shared storage gives one node
// a share of a network file system or an object store instead. This caps
// the read rate of the disk under a directory for this process and every
// process it starts afterwards (the nodes' ckptd and trainers, and the raw
// read that is the storage path's limit), with the kernel's block
// throttling: a blkio cgroup's throttle.read_bps_device (cgroup v1), or
// an io cgroup's io.max rbps (cgroup v2). Reads only: persists write at
// the disk's speed. A partition's limit goes on its disk.
// The cgroup is named for the process; the destructor moves the process
// back and removes it (one left by a SIGKILLed bench is an empty cgroup).
// Needs root and a block device under the directory (not tmpfs); when
// either is missing, Start() says why and throttles nothing.
// Not thread-safe: one per process.
#ifndef CKPT_BENCH_STORAGE_THROTTLE_H_
#define CKPT_BENCH_STORAGE_THROTTLE_H_

#include <string>

#include "absl/status/status.h"

namespace ckpt::bench {

class StorageThrottle {
 public:
  StorageThrottle() = default;
  StorageThrottle(const StorageThrottle&) = delete;
  StorageThrottle& operator=(const StorageThrottle&) = delete;
  ~StorageThrottle();

  // Caps reads of the disk that holds `dir` at `gbit` Gbit/s.
  // FailedPrecondition (with the reason) when it cannot.
  [[nodiscard]] absl::Status Start(const std::string& dir, double gbit);
  // Moves the process back to where it was and removes the cgroup.
  void Stop();
  // "major:minor" of the throttled disk, once started.
  const std::string& device() const { return device_; }

 private:
  std::string cgroup_;  // the cgroup's directory ("" when not started)
  std::string parent_;  // where the process was, to go back to
  std::string device_;
};

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_STORAGE_THROTTLE_H_
