#include "bench/replication_step.h"

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cluster_events.h"
#include "tests/cluster_harness.h"

namespace ckpt::bench {
namespace {

using ckpt::testing::Cluster;
using ckpt::testing::ClusterOptions;

bool Logged(const Cluster& c, int step) {
  const std::string line = absl::StrCat("\nstep ", step, " loss ");
  for (const char* id : {"a", "b"})
    if (c.LauncherLog(id).find(line) == std::string::npos) return false;
  return true;
}

// Waits (polling every 2 ms) until both ranks logged `step`; the time of
// that poll, or nullopt after `timeout`.
std::optional<std::chrono::steady_clock::time_point> WaitStep(
    const Cluster& c, int step, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (Logged(c, step)) return std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ReplicationStepFigures> MeasureReplicationStep(
    const ReplicationStepOptions& o) {
  if (o.warmup < 1 || o.steps < 1 || o.dim < 8 || o.layers < 1)
    return absl::InvalidArgumentError(
        "replication step: warmup, steps, dim and layers must be positive");
  ClusterOptions co;
  co.dir = o.dir;
  co.world_size = 2;
  co.nproc_per_node = 1;
  co.heartbeat_timeout_ms = 5000;  // a loaded machine: no false failures
  co.ckptd_args = {"--slots", "2"};
  int i = 1;
  for (const char* id : {"a", "b"})
    co.node_ckptd_args[id] = ReplicaNodeArgs(std::string("rack-") + id,
                                             o.port_base, i++, o.replicas);
  const int last = o.warmup + o.steps;
  co.trainer_command = {CKPT_WORKER_BINARY,
                        "--vocab",
                        "512",
                        "--dim",
                        std::to_string(o.dim),
                        "--layers",
                        std::to_string(o.layers),
                        "--seq",
                        "4",
                        "--batch",
                        "4",
                        "--seed",
                        "3",
                        "--steps",
                        std::to_string(last + 2),
                        "--ckpt-every",
                        "1",
                        "--log-every",
                        "1",
                        "--collective-timeout-s",
                        "300"};
  Cluster c(co);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  auto failed = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat(
        "replication step (replicas ", o.replicas ? "on" : "off", "): ", what,
        "\n", c.LauncherLog("a"), c.LauncherLog("b")));
  };
  auto t1 = WaitStep(c, o.warmup, std::chrono::seconds(300));
  if (!t1) return failed(absl::StrCat("no step ", o.warmup, " logged"));
  auto t2 = WaitStep(c, last, std::chrono::seconds(600));
  if (!t2) return failed(absl::StrCat("no step ", last, " logged"));
  ReplicationStepFigures f;
  f.step_s = std::chrono::duration<double>(*t2 - *t1).count() / o.steps;
  if (auto cluster = c.GetCluster())
    for (const auto& m : cluster->memory())
      f.replicated_ranks = m.replicated_ranks();
  // One rank's checkpoint: the largest shard file in the shared root.
  std::error_code ec;
  for (auto it =
           std::filesystem::recursive_directory_iterator(c.shared_root(), ec);
       !ec && it != std::filesystem::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec) && it->path().extension() == ".shard")
      f.state_bytes = std::max<uint64_t>(f.state_bytes, it->file_size(ec));
  return f;
}

}  // namespace ckpt::bench
