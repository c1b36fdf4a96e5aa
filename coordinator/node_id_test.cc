// Every coordinator RPC that names a node checks the id (ValidateNodeId)
// before it touches the state: a bad one is refused naming the field, and
// nothing changes (no node, job, order or event). On the fake clock.
#include <functional>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class NodeIdTest : public TwoNodeTest {
 protected:
  // The cluster and the event log, without the clock-dependent fields.
  std::string State() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (auto& n : *c.mutable_nodes()) n.clear_ms_since_heartbeat();
    return c.SerializeAsString() + coord_->Events({}).SerializeAsString();
  }
};

TEST_F(NodeIdTest, EveryRpcRefusesABadNodeIdNamingTheFieldChangingNothing) {
  const std::vector<std::string> bad_ids = {"", "..", "-n", "n/1",
                                            std::string(128, 'n')};
  // Each RPC with `id` where it names a node (the rest of the request good).
  const std::vector<
      std::pair<std::string, std::function<absl::Status(const std::string&)>>>
      rpcs = {
          {"node_id",
           [&](const std::string& id) {
             v1::RegisterNodeRequest r;
             r.set_node_id(id);
             r.set_capacity(1);
             return coord_->RegisterNode(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::HeartbeatRequest r;
             r.set_node_id(id);
             r.set_epoch(e1_);
             return coord_->Heartbeat(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportShardRequest r;
             r.set_node_id(id);
             r.set_epoch(e1_);
             r.set_job("job");
             r.set_step(1);
             r.set_state(v1::STAGED);
             return coord_->ReportShard(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportShardsRequest r;
             r.set_node_id(id);
             r.set_epoch(e1_);
             return coord_->ReportShards(r).status();
           }},
          {"source_node",
           [&](const std::string& id) {
             v1::ReportShardsRequest b;  // a replica names its source
             b.set_node_id("n1");
             b.set_epoch(e1_);
             v1::ShardReport* s = b.add_reports();
             s->set_job("job");
             s->set_step(1);
             s->set_rank(2);
             s->set_state(v1::REPLICATED);
             s->set_source_node(id);
             auto got = coord_->ReportShards(b);
             if (!got.ok()) return got.status();
             return absl::Status(
                 static_cast<absl::StatusCode>(got->results(0).code()),
                 got->results(0).message());
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportTrainerExitRequest r = TrainerExit(id, e1_, 0, 9);
             return coord_->ReportTrainerExit(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportFallbackRequest r;
             r.set_node_id(id);
             r.set_epoch(e1_);
             r.set_job("job");
             r.set_copy("memory");
             r.set_reason("x");
             return coord_->ReportFallback(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportStacksRequest r;
             r.set_node_id(id);
             r.set_job("job");
             return coord_->ReportStacks(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::CordonRequest r;
             r.set_node_id(id);
             r.set_reason("bad disk");
             return coord_->Cordon(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::UncordonRequest r;
             r.set_node_id(id);
             return coord_->Uncordon(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             v1::ReportNodeCheckRequest r;
             r.set_node_id(id);
             r.set_epoch(e1_);
             r.mutable_check()->set_name("trainer_unkillable");
             r.mutable_check()->set_reason("still there");
             return coord_->ReportNodeCheck(r).status();
           }},
          {"node_id",
           [&](const std::string& id) {
             if (id.empty()) return absl::InvalidArgumentError("node_id: ");
             v1::CheckHealthRequest r;  // empty: every node
             r.set_node_id(id);
             return coord_->CheckHealth(r).status();
           }},
          {"replica_refused.holder_node_id",
           [&](const std::string& id) {
             v1::HeartbeatRequest r;
             r.set_node_id("n1");
             r.set_epoch(e1_);
             r.mutable_replica_refused()->set_holder_node_id(id);
             return coord_->Heartbeat(r).status();
           }},
      };
  const std::string before = State();
  for (size_t i = 0; i < rpcs.size(); ++i) {
    const auto& [field, rpc] = rpcs[i];
    for (const std::string& id : bad_ids) {
      absl::Status s = rpc(id);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
          << "rpc " << i << " id \"" << id << "\": " << s;
      EXPECT_EQ(s.message().rfind(field + ": ", 0), 0u)
          << "rpc " << i << " id \"" << id << "\": " << s;
    }
  }
  EXPECT_EQ(State(), before) << "a refusal changed the state";
}

}  // namespace
}  // namespace ckpt::coordinator
