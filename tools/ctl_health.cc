// ckptctl health: each node's latest health check (daemon/health.h) and
// the coordinator's verdict (coordinator/health_state.h), from GetCluster.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

void WriteHealth(const std::vector<const cv1::NodeRecord*>& nodes) {
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

void PrintHealth(const std::vector<const cv1::NodeRecord*>& nodes) {
  Table t(
      {"NODE", "HEALTHY", "CHECK", "RESULT", "FIGURE", "SECONDS", "REASON"});
  for (const cv1::NodeRecord* n : nodes) {
    const std::string verdict = n->health() != cv1::ALIVE ? "dead"
                                : n->unhealthy()
                                    ? "NO (" + n->unhealthy_check() + ")"
                                    : "yes";
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
                       const coordinator::TlsFiles& tls,
                       const std::string& node, bool json) {
  if (coordinator.empty())
    return absl::InvalidArgumentError(
        "--coordinator: not given (HOST:PORT of ckpt-coordinator)");
  absl::Status s =
      coordinator::ParseAddressList(coordinator, "--coordinator").status();
  if (s.ok() && !node.empty()) s = ValidateJobName(node, "--node");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::GetClusterResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::GetCluster,
                      cv1::GetClusterRequest{}, &resp, std::chrono::seconds(5)),
      "GetCluster", (*client)->current());
  if (!s.ok()) return s;
  std::vector<const cv1::NodeRecord*> nodes;
  for (const cv1::NodeRecord& n : resp.nodes())
    if (node.empty() || n.node_id() == node) nodes.push_back(&n);
  if (!node.empty() && nodes.empty())
    return absl::NotFoundError("--node: \"" + node + "\" is not registered");
  if (json)
    WriteHealth(nodes);
  else
    PrintHealth(nodes);
  return absl::OkStatus();
}

}  // namespace ckpt::tools
