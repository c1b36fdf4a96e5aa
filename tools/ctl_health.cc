// ckptctl health: runs the nodes' health checks now (CheckHealth; the
// nodes report with their next heartbeats) and shows each node's newest
// check (daemon/health/health.h) and the coordinator's verdict
// (coordinator/health_state.h), from GetCluster. --last: only show.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

// Whether `n` answered request `id` (0: none was made).
bool Answered(const cv1::NodeRecord& n, uint64_t id) {
  return id == 0 || n.health_check_id() == id;
}

void WriteHealth(const std::vector<const cv1::NodeRecord*>& nodes,
                 uint64_t id) {
  JsonWriter w;
  w.BeginObject().Key("nodes").BeginArray();
  for (const cv1::NodeRecord* n : nodes) {
    w.BeginObject()
        .Field("node_id", n->node_id())
        .Field("alive", n->health() == cv1::ALIVE)
        .Field("spare", n->spare())
        .Field("healthy", !n->unhealthy())
        .Field("check", n->unhealthy_check())
        .Field("reason", n->unhealthy_reason())
        .Field("answered", Answered(*n, id))
        .Field("seconds_since_check",
               static_cast<double>(n->ms_since_health_check()) / 1000)
        .Key("checks")
        .BeginArray();
    for (const cv1::HealthCheck& c : n->health_report().checks())
      w.BeginObject()
          .Field("name", c.name())
          .Field("passed", c.passed())
          .Field("skipped", c.skipped())
          .Field("reason", c.reason())
          .Field("figure", c.figure())
          .Field("unit", c.unit())
          .Field("seconds", c.seconds())
          .EndObject();
    w.EndArray().EndObject();
  }
  w.EndArray().EndObject();
  std::printf("%s\n", w.str().c_str());
}

void PrintHealth(const std::vector<const cv1::NodeRecord*>& nodes,
                 uint64_t id) {
  Table t(
      {"NODE", "HEALTHY", "CHECK", "RESULT", "FIGURE", "SECONDS", "REASON"});
  for (const cv1::NodeRecord* n : nodes) {
    std::string verdict = n->health() != cv1::ALIVE ? "dead"
                          : n->unhealthy() ? "NO (" + n->unhealthy_check() + ")"
                                           : "yes";
    if (n->health() == cv1::ALIVE && !Answered(*n, id))
      verdict += absl::StrFormat(" (no answer; report %.0f s old)",
                                 n->ms_since_health_check() / 1000.0);
    if (n->health_report().checks().empty())
      t.AddRow({n->node_id(), verdict, "-", "no report", "-", "-", "-"});
    for (const cv1::HealthCheck& c : n->health_report().checks())
      t.AddRow({n->node_id(), verdict, c.name(),
                !c.passed()   ? "FAILED"
                : c.skipped() ? "skipped"
                              : "ok",
                c.unit().empty()
                    ? "-"
                    : absl::StrFormat("%.2f %s", c.figure(), c.unit()),
                absl::StrFormat("%.2f", c.seconds()),
                c.reason().empty() ? "-" : c.reason()});
  }
  if (t.empty())
    std::printf("no nodes\n");
  else
    t.Print(stdout);
}

}  // namespace

absl::Status RunHealth(const std::string& coordinator,
                       const coordinator::TlsFiles& tls, const HealthArgs& args,
                       bool json) {
  if (coordinator.empty())
    return absl::InvalidArgumentError(
        "--coordinator: not given (HOST:PORT of ckpt-coordinator)");
  absl::Status s =
      coordinator::ParseAddressList(coordinator, "--coordinator").status();
  if (s.ok() && !args.node.empty()) s = ValidateJobName(args.node, "--node");
  if (s.ok() && (args.timeout_s < 1 || args.timeout_s > 3600))
    s = absl::InvalidArgumentError(
        absl::StrCat("--timeout-s: ", args.timeout_s, " not in [1, 3600]"));
  if (s.ok() && args.last && args.network)
    s = absl::InvalidArgumentError("--network: runs a check; not with --last");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  auto cluster = [&](cv1::GetClusterResponse* resp) {
    return coordinator::CoordStatus(
        (*client)->Call(&cv1::Coordinator::Stub::GetCluster,
                        cv1::GetClusterRequest{}, resp,
                        std::chrono::seconds(5)),
        "GetCluster", (*client)->current());
  };
  uint64_t id = 0;
  std::vector<std::string> asked;
  if (!args.last) {
    cv1::CheckHealthRequest req;
    req.set_node_id(args.node);
    req.set_network(args.network);
    cv1::CheckHealthResponse resp;
    s = coordinator::CoordStatus(
        (*client)->Call(&cv1::Coordinator::Stub::CheckHealth, req, &resp,
                        std::chrono::seconds(5)),
        "CheckHealth", (*client)->current());
    if (s.code() == absl::StatusCode::kFailedPrecondition && !args.node.empty())
      return absl::NotFoundError("--node: " + std::string(s.message()));
    if (!s.ok()) return s;
    id = resp.request_id();
    asked.assign(resp.node_ids().begin(), resp.node_ids().end());
  }
  // Wait for every node asked to answer (or die, or the time to run out).
  cv1::GetClusterResponse resp;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(args.timeout_s);
  std::vector<std::string> silent;
  for (;;) {
    resp.Clear();
    s = cluster(&resp);
    if (!s.ok()) return s;
    silent.clear();
    for (const cv1::NodeRecord& n : resp.nodes())
      if (std::find(asked.begin(), asked.end(), n.node_id()) != asked.end() &&
          n.health() == cv1::ALIVE && !Answered(n, id))
        silent.push_back(n.node_id());
    if (silent.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::vector<const cv1::NodeRecord*> nodes;
  for (const cv1::NodeRecord& n : resp.nodes())
    if (args.node.empty() || n.node_id() == args.node) nodes.push_back(&n);
  if (!args.node.empty() && nodes.empty())
    return absl::NotFoundError("--node: \"" + args.node +
                               "\" is not registered");
  if (json)
    WriteHealth(nodes, id);
  else
    PrintHealth(nodes, id);
  if (!silent.empty())
    return absl::DeadlineExceededError(absl::StrCat(
        "nodes ", absl::StrJoin(silent, ","), " did not report a check within ",
        args.timeout_s, " s (--timeout-s); shown: their previous reports"));
  return absl::OkStatus();
}

}  // namespace ckpt::tools
