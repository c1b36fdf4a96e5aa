// The pairwise network check (node health): the coordinator
// pairs the alive nodes that run a probe listener (daemon/agent/net_probe.h) in
// a ring over their sorted ids — each node sends one bounded TCP probe to
// the next and receives one from the previous (two nodes: one probe) —
// and hands both ends of each pair a one-time token over their
// authenticated heartbeat channel. A node is told to send only after the
// receiver has heartbeaten again since it was told the token (the agent
// registers a token before its next heartbeat), so the receiver always
// expects it first.
//
// A node's figure is the best MB/s of the probes it took part in: a slow
// link between two good nodes leaves each of them another pair, while a
// node whose every link is slow stands out against the cluster's median
// (health_state.h compares "network" like memcpy). A round starts when the
// set of probing nodes changes; a probe without a result within
// order_ttl_ms counts as failed. A round with a low figure is run once
// more, and each node keeps the better of its two figures. Not thread-safe: the
// coordinator calls it under its state lock (memory only, no I/O).
#ifndef CKPT_COORDINATOR_NET_CHECK_H_
#define CKPT_COORDINATOR_NET_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator.pb.h"

namespace ckpt::coordinator {

namespace v1 = ::ckpt::coord::v1;

struct NetEndpoint {
  std::string host;
  uint32_t port = 0;
  bool operator==(const NetEndpoint&) const = default;
};

struct NetCheckOptions {
  uint64_t bytes = 64ull << 20;  // per probe
  uint32_t timeout_ms = 5000;    // per probe, connect included
  int64_t order_ttl_ms = 30000;  // a probe not reported by then failed
  // A node whose figure is below min_ratio x the round's median (or 0) is
  // sampled once more before the round's figures are published: a probe
  // that met a busy CPU or a passing burst of traffic is not a verdict.
  double min_ratio = 0.5;
};

// A node's result of the finished round.
struct NetFigure {
  double mb_per_s = 0;  // the best of its probes (0: every one failed)
  std::string errors;   // why its probes failed, if they did
};

// A heartbeat's net_results: at most 16, tokens of 32 hex characters,
// peers and errors printable, figures finite and not negative. A refusal
// names the field.
[[nodiscard]] absl::Status ValidateNetResults(const v1::HeartbeatRequest& req);

// A node's figure as the check "network" (MB/s, failed at 0, its errors
// bounded as a report's reason is) in its health report, replacing the
// previous round's.
void PutNetworkCheck(const NetFigure& f, v1::NodeHealthReport* report);

class NetCheckPlanner {
 public:
  explicit NetCheckPlanner(NetCheckOptions options = {}) : options_(options) {}

  // The probing nodes now (id -> where their listener is); a set other
  // than the last one starts a new round.
  void SetNodes(const std::map<std::string, NetEndpoint>& nodes,
                int64_t now_ms);
  // `node`'s report of a probe it sent; a token not of this round is
  // ignored. True when this finished the round.
  bool Record(const std::string& node, const v1::NetProbeResult& result,
              int64_t now_ms);
  // What `node` is told in this heartbeat's answer: tokens to expect, and
  // probes to send once their receiver expects them.
  std::vector<v1::NetProbeOrder> OrdersFor(const std::string& node,
                                           int64_t now_ms);
  // Forgets the node set, so that the next SetNodes starts a new round
  // (an on-demand check, CheckHealth with network); a round under way is
  // dropped.
  void Restart() { nodes_.clear(); }
  // True (once) when probes expired and so finished the round.
  bool ExpireLate(int64_t now_ms);
  // One heartbeat of req.node_id with the probing nodes now: SetNodes, its
  // results recorded, late probes expired, its orders put in `resp`. True
  // when a round finished (figures() are new).
  bool Heartbeat(const std::map<std::string, NetEndpoint>& nodes,
                 const v1::HeartbeatRequest& req, int64_t now_ms,
                 v1::HeartbeatResponse* resp);
  // The same with the node set given by the last SetNodes: costs a
  // heartbeat nothing proportional to the cluster once a round finished.
  bool Heartbeat(const v1::HeartbeatRequest& req, int64_t now_ms,
                 v1::HeartbeatResponse* resp);
  // Every node's figure of the last finished round; empty before one.
  const std::map<std::string, NetFigure>& figures() const { return figures_; }
  uint64_t round() const { return round_; }

 private:
  struct Probe {
    std::string sender, receiver, token;
    bool accept_told = false;   // the receiver got the token...
    bool accept_known = false;  // ...and heartbeat again since
    bool done = false;
    double mb_per_s = 0;
    std::string error;
  };
  // Fills figures_ from the round's probes once all are done, or starts
  // the round again when a figure is low and was not sampled twice yet.
  bool FinishIfDone(int64_t now_ms);
  // New probes (and tokens) over nodes_.
  void StartRound(int64_t now_ms);
  // Whether any figure is 0 or below min_ratio x their median.
  bool AnyLow(const std::map<std::string, NetFigure>& figures) const;

  const NetCheckOptions options_;
  std::map<std::string, NetEndpoint> nodes_;
  std::vector<Probe> probes_;
  int64_t round_start_ms_ = 0;
  uint64_t round_ = 0;
  bool finished_ = true;
  std::map<std::string, NetFigure> figures_;
  // The first sample of a round being run again (empty otherwise).
  std::map<std::string, NetFigure> first_sample_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_NET_CHECK_H_
