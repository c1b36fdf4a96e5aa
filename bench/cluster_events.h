// Small helpers the cluster benchmarks share (liveness_bench.cc,
// node_loss_bench.cc, replication_step.cc): one monotonic clock in
// milliseconds, a failure that carries the cluster's logs and the
// coordinator's event log, and a replica node's flags.
#ifndef CKPT_BENCH_CLUSTER_EVENTS_H_
#define CKPT_BENCH_CLUSTER_EVENTS_H_

#include <chrono>
#include <cstdint>
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
