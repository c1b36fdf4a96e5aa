// NodeAgent's private pieces shared by its files (node_agent*.cc): the
// coordinator channel it calls through, and how a refusal of the node's
// epoch looks. Not part of the daemon's interface.
#ifndef CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_
#define CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "coordinator/client/leader_channel.h"
#include "daemon/agent/node_agent.h"

namespace ckpt::daemon {

class NodeAgent::Rpc {
 public:
  // The options were validated (daemon/options.cc loads the TLS files once).
  Rpc(const std::string& targets, const coordinator::TlsFiles& tls)
      : client_(coordinator::CoordinatorClient::Create(targets, tls).value()) {}
  template <typename Req, typename Resp, typename Call>
  grpc::Status Invoke(Call call, const Req& req, Resp* resp,
                      std::chrono::milliseconds timeout) {
    return client_->Call(call, req, resp, timeout);
  }
  // For streams (CoordinatorWatch), which follow the leader themselves.
  coordinator::CoordinatorClient& client() { return *client_; }

 private:
  std::unique_ptr<coordinator::CoordinatorClient> client_;
};

// The coordinator refuses this incarnation of the node: declared dead
// (fenced) or unknown after losing its state.
inline bool Fenced(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
         s.error_code() == grpc::StatusCode::NOT_FOUND;
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_NODE_AGENT_RPC_H_
