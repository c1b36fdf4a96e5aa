// Small helpers the cluster benchmarks share (liveness_bench.cc,
// node_loss_bench.cc, replication_step.cc, restart_bench.cc): one monotonic
// clock in milliseconds, the first event of a kind, a failure that carries
// the cluster's logs and the coordinator's event log, and a replica node's
// flags.
#ifndef CKPT_BENCH_CLUSTER_EVENTS_H_
#define CKPT_BENCH_CLUSTER_EVENTS_H_

#include <chrono>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator.grpc.pb.h"
#include "tests/cluster_harness.h"

namespace ckpt::bench {

inline int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The first event of `kind` at or after `from_ms` (and for `node` if given).
inline std::optional<ckpt::coord::v1::Event> FirstEvent(
    const std::vector<ckpt::coord::v1::Event>& events,
    ckpt::coord::v1::EventKind kind, long long from_ms = LLONG_MIN,
    const std::string& node = "") {
  for (const auto& e : events)
    if (e.kind() == kind && e.time_ms() >= from_ms &&
        (node.empty() || e.node_id() == node))
      return e;
  return std::nullopt;
}

inline std::string EventLog(const ckpt::testing::Cluster& c) {
  std::string out = "coordinator events:\n";
  for (const auto& e : c.Events())
    absl::StrAppend(&out, e.time_ms(), " ",
                    ckpt::coord::v1::EventKind_Name(e.kind()), " ", e.node_id(),
                    " ", e.detail(), "\n");
  return out;
}

inline absl::Status Failed(const std::string& what,
                           const ckpt::testing::Cluster& c) {
  return absl::InternalError(
      absl::StrCat(what, "\n", c.DumpLogs(), EventLog(c)));
}

// The ckptd flags of the `index`th (1-based, at most 6) replica node of a
// cluster bench: its failure domain, and both its replica ports inside the
// bench's block of 16 (gRPC at +index, bulk at +6+index; +0 is the plain
// TCP limit's), which --link-gbit shapes as a whole.
inline std::vector<std::string> ReplicaNodeArgs(const std::string& domain,
                                                int port_base, int index,
                                                bool replicas) {
  return {"--domain",
          domain,
          "--replica-port",
          std::to_string(port_base + index),
          "--replica-bulk-port",
          std::to_string(port_base + 6 + index),
          "--replicas",
          replicas ? "1" : "0"};
}

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_CLUSTER_EVENTS_H_
