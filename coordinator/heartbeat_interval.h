// The heartbeat interval the coordinator tells its nodes (in every
// RegisterNode and Heartbeat reply), as a function of the heartbeat
// timeout and the number of registered nodes:
//
//   interval = clamp(timeout / 5 * nodes / nodes_per_base,
//                    timeout / 5, timeout / 3)      (and >= 20 ms)
//
// Up to `nodes_per_base` nodes every node heartbeats every timeout / 5,
// as the agent always did; a larger cluster heartbeats less often, in
// proportion, so the coordinator's heartbeat load grows more slowly than
// the cluster. The cap keeps at least 3 intervals inside the timeout, so
// the timeout itself never changes: a node is still declared dead within
// the timeout (+ one detector tick) of its last heartbeat, whatever the
// cluster's size, and a live node must miss 3 heartbeats in a row first.
#ifndef CKPT_COORDINATOR_HEARTBEAT_INTERVAL_H_
#define CKPT_COORDINATOR_HEARTBEAT_INTERVAL_H_

#include <algorithm>
#include <cstdint>

namespace ckpt::coordinator {

// The agent's floor: no interval is shorter.
inline constexpr int64_t kMinHeartbeatIntervalMs = 20;

inline int64_t HeartbeatIntervalMs(int64_t timeout_ms, uint64_t nodes,
                                   uint64_t nodes_per_base) {
  const int64_t lo = std::max(timeout_ms / 5, kMinHeartbeatIntervalMs);
  const int64_t hi = std::max(timeout_ms / 3, lo);
  if (nodes_per_base == 0 || nodes <= nodes_per_base) return lo;
  // timeout_ms <= 1 h and nodes <= 2^20 in practice; doubles keep any
  // input from overflowing.
  const double scaled = static_cast<double>(lo) * static_cast<double>(nodes) /
                        static_cast<double>(nodes_per_base);
  return scaled >= static_cast<double>(hi) ? hi : static_cast<int64_t>(scaled);
}

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_HEARTBEAT_INTERVAL_H_
