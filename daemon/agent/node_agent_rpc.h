// NodeAgent's private pieces shared by its files (node_agent*.cc): the
// coordinator channel it calls through, and how a refusal of the node's
// epoch looks. Not part of the daemon's interface.
#ifndef CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_
#define CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "coordinator/client/leader_channel.h"
#include "daemon/agent/node_agent.h"

namespace ckpt::daemon {

class NodeAgent::Rpc {
 public:
  // The options were validated (daemon/options.cc loads the TLS files once).
  explicit Rpc(const NodeAgentOptions& options);
  template <typename Req, typename Resp, typename Call>
  grpc::Status Invoke(Call call, const Req& req, Resp* resp,
                      std::chrono::milliseconds timeout) {
    return client_->Call(call, req, resp, timeout);
  }
  // Heartbeat and ReportShards: through the relay (--coordinator-relay)
  // with a deadline of `relay_timeout`, unless a failure of the relay's put
  // the agent on the direct path for a backoff. A call the relay marks
  // ckpt-relay-failed, or that does not reach it (UNAVAILABLE,
  // DEADLINE_EXCEEDED, UNIMPLEMENTED), goes to the coordinator directly at
  // once. Every other answer is the coordinator's, as if direct.
  template <typename Req, typename Resp, typename Call>
  grpc::Status InvokeRelayed(Call call, const Req& req, Resp* resp,
                             std::chrono::milliseconds timeout,
                             std::chrono::milliseconds relay_timeout,
                             bool* relayed = nullptr) {
    if (relayed != nullptr) *relayed = false;
    if (relay_ && RelayDue()) {
      grpc::ClientContext ctx;
      coordinator::SetDeadline(&ctx, relay_timeout);
      grpc::Status s = (relay_.get()->*call)(&ctx, req, resp);
      if (!RelayFailed(s, ctx)) {
        RelayAnswered();
        if (relayed != nullptr) *relayed = true;
        return s;
      }
      resp->Clear();
    }
    return client_->Call(call, req, resp, timeout);
  }
  // For streams (CoordinatorWatch), which follow the leader themselves.
  coordinator::CoordinatorClient& client() { return *client_; }

 private:
  // Whether to try the relay now (no backoff running).
  bool RelayDue();
  // Classifies the relay's answer; a failure starts (or doubles) the
  // backoff, logs the switch once and counts the fallback.
  bool RelayFailed(const grpc::Status& s, const grpc::ClientContext& ctx);
  // The relay carried a call: the backoff ends, the switch back is logged.
  void RelayAnswered();

  const NodeAgentOptions& options_;
  std::unique_ptr<coordinator::CoordinatorClient> client_;
  std::unique_ptr<coordinator::CoordinatorClient::Stub> relay_;  // or null
  std::mutex relay_mu_;  // a leaf; never held across a call
  std::chrono::steady_clock::time_point direct_until_;
  std::chrono::milliseconds relay_backoff_{0};
  bool on_relay_ = true;
};

// The coordinator refuses this incarnation of the node: declared dead
// (fenced) or unknown after losing its state.
inline bool Fenced(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
         s.error_code() == grpc::StatusCode::NOT_FOUND;
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_
