// Node health checks (PAI's "3D check"): what `ckptd
// --health-check` and every ckptd start run before the node says READY,
// and what the node reports to the coordinator with its registration.
//
// Checks, each bounded by HealthOptions::timeout (a check still running at
// its deadline fails with "timed out"; its thread is left behind, detached,
// holding only its own copies, so a hung shared root never hangs ckptd):
//   memcpy       memory copy bandwidth, GB/s (judged by the coordinator
//                against the cluster's median; fails here only if 0)
//   shm          free bytes in the shm directory (plus what the daemon's
//                own arenas there hold) >= shm_need_bytes, and a
//                probe file there can be created, written and removed;
//                passes with a reason when arenas there get no huge pages
//   root         write + fsync + read back + delete of a probe on --root
//   shared_root  the same on --shared-root (a PUT/GET/DELETE on s3://);
//                skipped when there is none
//   cuda         device enumeration and a pinned H2D/D2H copy, GB/s;
//                skipped with the reason where CUDA is not built or no
//                device is present (health_cuda.cc / health_nocuda.cc)
// Functions only; thread-safe.
#ifndef CKPT_DAEMON_HEALTH_HEALTH_H_
#define CKPT_DAEMON_HEALTH_HEALTH_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator.pb.h"
#include "storage/object_backend.h"

namespace ckpt::daemon {

struct HealthOptions {
  std::string root;         // a directory
  std::string shared_root;  // a directory, s3://BUCKET/PREFIX, or empty
  storage::ObjectStoreConfig object_config;  // for an s3:// shared root
  std::string shm_dir = "/dev/shm";
  uint64_t shm_need_bytes = 0;  // what the configured capacity needs
  // The daemon's arenas ("<prefix>.*" in shm_dir) count as room: a re-check
  // of a node that hosts ranks finds their memory in use by design.
  std::string shm_prefix;
  uint64_t memcpy_bytes = 64ull << 20;
  uint64_t probe_bytes = 1ull << 20;
  std::chrono::milliseconds timeout{10000};  // per check
};

struct HealthCheckResult {
  std::string name;
  enum class Outcome { kPassed, kFailed, kSkipped } outcome;
  std::string reason;  // why it failed or was skipped
  double figure = 0;
  std::string unit;
  double seconds = 0;
  bool passed() const { return outcome != Outcome::kFailed; }
};

// Runs every check in turn; never fails itself (a check that cannot run is
// a failed check naming why).
std::vector<HealthCheckResult> RunHealthChecks(const HealthOptions& options);

// Runs `check` on its own thread; a check not done within `timeout` fails
// with "timed out after N s" (the thread is detached and finishes, or not,
// on its own).
HealthCheckResult RunBounded(const std::string& name,
                             std::function<HealthCheckResult()> check,
                             std::chrono::milliseconds timeout);

// The CUDA check (health_cuda.cc with CUDA, else health_nocuda.cc).
HealthCheckResult CheckCuda(uint64_t bytes);

bool AllPassed(const std::vector<HealthCheckResult>& results);
// One line per check: "memcpy: ok 12.3 GB/s (0.21 s)", "root: FAILED ...".
std::string HealthText(const std::vector<HealthCheckResult>& results);
std::string HealthJson(const std::vector<HealthCheckResult>& results);
coord::v1::NodeHealthReport ToHealthProto(
    const std::vector<HealthCheckResult>& results);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_HEALTH_HEALTH_H_
