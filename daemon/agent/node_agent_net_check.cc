// NodeAgent (node_agent.h): its part of the pairwise network check — the
// probe listener, the tokens the coordinator says to expect, the probes it
// says to send (each on a thread of its own, so heartbeats go on), and
// their results, sent with the next heartbeats (coordinator/net_check.h).
#include <arpa/inet.h>

#include "absl/strings/str_cat.h"
#include "coordinator.grpc.pb.h"
#include "daemon/agent/node_agent.h"
#include "daemon/core/engine_util.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

void NodeAgent::StartNetProbeServer() {
  if (options_.net_probe_port < 0) return;
  NetProbeServerOptions o;
  in_addr ignored;
  o.host = inet_pton(AF_INET, options_.address.c_str(), &ignored) == 1
               ? options_.address
               : "0.0.0.0";
  o.port = options_.net_probe_port;
  o.slow = options_.net_probe_slow;
  auto server = NetProbeServer::Listen(o);
  if (!server.ok()) {
    // The node still works; it is only left out of the network check.
    LogWarning(absl::StrCat("network check: no listener: ",
                            server.status().message()));
    return;
  }
  net_server_ = std::move(*server);
  LogInfo(absl::StrCat("network check: listening on ", o.host, ":",
                       net_server_->port()));
}

void NodeAgent::TakeNetProbes(const cv1::HeartbeatResponse& resp) {
  if (!net_server_) return;
  for (const cv1::NetProbeOrder& o : resp.net_probes()) {
    if (!o.send()) {
      // Registered before this thread's next heartbeat, which is what the
      // coordinator waits for before it tells the sender to go.
      net_server_->Expect(o.token(), std::chrono::steady_clock::now() +
                                         std::chrono::minutes(1));
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (net_probers_.count(o.token()) || net_done_.count(o.token())) continue;
    LogInfo(absl::StrCat("network check: probing ", o.peer_node(), " at ",
                         o.peer_host(), ":", o.peer_port(), " (", o.bytes(),
                         " bytes)"));
    net_probers_[o.token()] = std::thread([this, o] {
      absl::StatusOr<NetProbeResult> r = RunNetProbe(
          o.peer_host(), static_cast<int>(o.peer_port()), o.token(), o.bytes(),
          std::chrono::milliseconds(o.timeout_ms()), options_.net_probe_slow);
      cv1::NetProbeResult out;
      out.set_token(o.token());
      if (r.ok()) {
        out.set_mb_per_s(r->mb_per_s);
        LogInfo(absl::StrCat("network check: ", o.peer_node(), ": ", r->bytes,
                             " bytes in ", r->seconds, " s, ", r->mb_per_s,
                             " MB/s", r->cut_off ? " (cut off)" : ""));
      } else {
        out.set_error(std::string(r.status().message()).substr(0, 512));
        LogWarning(absl::StrCat("network check: ", o.peer_node(), ": ",
                                r.status().message()));
      }
      std::lock_guard<std::mutex> lock(mu_);
      net_done_[o.token()] = std::move(out);
    });
  }
}

void NodeAgent::AddNetResults(cv1::HeartbeatRequest* req) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [token, r] : net_done_) {
    if (req->net_results_size() == 16) break;  // the rest next time
    *req->add_net_results() = r;
  }
}

void NodeAgent::NetResultsSent(const cv1::HeartbeatRequest& req) {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const cv1::NetProbeResult& r : req.net_results()) {
      net_done_.erase(r.token());
      auto t = net_probers_.find(r.token());
      if (t == net_probers_.end()) continue;
      done.push_back(std::move(t->second));
      net_probers_.erase(t);
    }
  }
  for (std::thread& t : done) t.join();  // each has stored its result
}

}  // namespace ckpt::daemon
