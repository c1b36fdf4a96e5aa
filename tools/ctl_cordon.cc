// ckptctl cordon / uncordon: keep a node out of placement (its ranks move
// to a spare) or let it back, through the coordinator's leader.
#include <cstdio>

#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/ctl_coord.h"
#include "tools/json_writer.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

// The coordinator checks the same; a refusal here costs no round trip.
constexpr size_t kMaxReasonBytes = 512;

}  // namespace

absl::Status RunCordon(const std::string& coordinator,
                       const coordinator::TlsFiles& tls,
                       const std::string& node, const std::string& reason,
                       bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok()) s = ValidateJobName(node, "NODE");
  if (s.ok()) s = ValidatePrintable(reason, "--reason", kMaxReasonBytes);
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::CordonRequest req;
  req.set_node_id(node);
  req.set_reason(reason);
  cv1::CordonResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::Cordon, req, &resp, kRpcTimeout),
      "Cordon", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("node_id", node).Field("cordoned", true);
    w.Field("changed", resp.changed()).Field("reason", resp.reason());
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else if (resp.changed()) {
    std::printf("node %s cordoned: %s (its ranks move to a spare)\n",
                node.c_str(), resp.reason().c_str());
  } else {
    std::printf("node %s was already cordoned: %s\n", node.c_str(),
                resp.reason().c_str());
  }
  return absl::OkStatus();
}

absl::Status RunUncordon(const std::string& coordinator,
                         const coordinator::TlsFiles& tls,
                         const std::string& node, bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok()) s = ValidateJobName(node, "NODE");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::UncordonRequest req;
  req.set_node_id(node);
  cv1::UncordonResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::Uncordon, req, &resp,
                      kRpcTimeout),
      "Uncordon", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("node_id", node).Field("cordoned", false);
    w.Field("changed", resp.changed()).Field("spare", resp.spare());
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("node %s %s%s\n", node.c_str(),
                resp.changed() ? "uncordoned" : "was not cordoned",
                resp.spare() ? " (a spare: it may take ranks)" : "");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
