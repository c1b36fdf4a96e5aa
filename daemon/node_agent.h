// NodeAgent: ckptd's side of a multi-node job. It registers this node with
// the coordinator, heartbeats, passes the rank placement to the engine,
// reports every shard as staged and then durable, and carries out the
// coordinator's orders: PREFETCH loads shards from the shared root into
// this node's shared memory (on its own thread, so heartbeats go on) and is
// acknowledged when done; RESTART and STOP are acknowledged at once, since
// ckptrun acts on them through the job's generation.
//
// Fencing: each report carries the epoch the node had when the shard was
// committed, so a node declared dead (timed out, SIGSTOPped) cannot make the
// coordinator count anything it committed before it re-registered. When a
// heartbeat is refused for its epoch, the agent registers again (a new
// epoch) and drops the reports of the old one.
//
// The coordinator may be down or restarting: reports wait in order and are
// retried; the engine never waits on the coordinator. Thread-safe.
#ifndef CKPT_DAEMON_NODE_AGENT_H_
#define CKPT_DAEMON_NODE_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine.h"

namespace ckpt::daemon {

struct NodeAgentOptions {
  std::string coordinator;  // HOST:PORT
  std::string node_id;
  std::string address;      // advertised to the coordinator (MASTER_ADDR)
  uint32_t capacity = 8;    // ranks this node can host
  bool spare = false;
  std::chrono::milliseconds rpc_timeout{3000};
};

class NodeAgent {
 public:
  explicit NodeAgent(NodeAgentOptions options);
  ~NodeAgent();  // stops the threads; queued reports are dropped

  // Queues a report; the engine's on_shard callback.
  void Report(const ShardReport& report);
  // Starts registering, heartbeating and reporting; engine must outlive
  // the agent.
  void Start(Engine* engine);
  uint64_t epoch() const { return epoch_.load(); }

 private:
  struct Queued {
    ShardReport report;
    uint64_t epoch = 0;  // 0: committed before the first registration
  };
  class Rpc;

  struct Hosting {
    std::vector<uint32_t> ranks;
    std::optional<uint64_t> keep_from;
  };
  void HeartbeatLoop();
  void ApplyLoop();
  void ReportLoop();
  void RunPrefetch(uint64_t order_id, std::string job, uint32_t world_size, uint64_t step,
                   std::vector<uint32_t> ranks, std::vector<std::string> keys);
  bool WaitFor(std::chrono::milliseconds d);  // false when stopping

  const NodeAgentOptions options_;
  Engine* engine_ = nullptr;
  std::unique_ptr<Rpc> rpc_;
  std::atomic<uint64_t> epoch_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool kick_ = false;                // heartbeat now: an order is done
  std::deque<Queued> reports_;
  std::vector<uint64_t> acked_;      // to acknowledge in the next heartbeat
  std::set<uint64_t> handled_;       // orders taken (prefetches may still run)
  std::vector<std::thread> prefetchers_;
  // Placement to pass to the engine, whose mutex may be held for seconds
  // (an arena being created): the heartbeat thread must never wait on it.
  std::map<std::string, Hosting> hosting_;
  bool hosting_changed_ = false;
  std::thread applier_;
  std::thread heartbeat_;
  std::thread reporter_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_NODE_AGENT_H_
