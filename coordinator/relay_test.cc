// RelayBatch against a real in-process server over a loopback socket: a
// relay's batch of many nodes' heartbeats and ReportShards calls, each item
// answered exactly as its direct call (doc/coordinator-scale.md "Relays").
// Under mTLS, who may relay is tests/tls_test.cc's.
#include "coordinator/relay/relay.h"

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "coordinator.grpc.pb.h"
#include "coordinator/server_testing.h"
#include "tests/metrics_text.h"

namespace ckpt::coordinator {
namespace {

using ckpt::testing::SampleValue;
using google::protobuf::util::MessageDifferencer;

class RelayTest : public ServerTest {
 protected:
  void SetUp() override {
    Start();
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  }
  // Registers `node` over gRPC; its epoch.
  uint64_t Register(const std::string& node, uint32_t capacity = 2) {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_address("127.0.0.1:1");
    req.set_capacity(capacity);
    v1::RegisterNodeResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->RegisterNode(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.epoch();
  }
  static v1::HeartbeatRequest Beat(const std::string& node, uint64_t epoch) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    return req;
  }
  grpc::Status Relay(const v1::RelayBatchRequest& req,
                     v1::RelayBatchResponse* resp,
                     std::string* retry_after = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    grpc::Status s = stub_->RelayBatch(&ctx, req, resp);
    if (retry_after) {
      retry_after->clear();
      auto it = ctx.GetServerTrailingMetadata().find(kRetryAfterMetadataKey);
      if (it != ctx.GetServerTrailingMetadata().end())
        retry_after->assign(it->second.data(), it->second.size());
    }
    return s;
  }
  grpc::Status Direct(const v1::HeartbeatRequest& req,
                      v1::HeartbeatResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->Heartbeat(&ctx, req, resp);
  }
  grpc::Status Direct(const v1::ReportShardsRequest& req,
                      v1::ReportShardsResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->ReportShards(&ctx, req, resp);
  }
  v1::NodeRecord Node(const std::string& id) {
    const v1::GetClusterResponse cluster = server_->coordinator()->GetCluster();
    for (const v1::NodeRecord& n : cluster.nodes())
      if (n.node_id() == id) return n;
    return {};
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(RelayTest, ABatchIsAnsweredAsTheDirectCallsWouldHaveBeen) {
  const uint64_t e1 = Register("n1"), e2 = Register("n2");
  RegisterJob(4);
  TrainerDied("n1", e1, 0);  // a plan: orders for both nodes
  v1::RelayBatchRequest batch;
  batch.set_relay_id("rack-1");
  *batch.add_heartbeats() = Beat("n1", e1);
  *batch.add_heartbeats() = Beat("n2", e2);
  *batch.add_reports() = NodeBatch("n1", e1, 5, {0, 1}, v1::STAGED);
  v1::RelayBatchResponse relayed;
  grpc::Status s = Relay(batch, &relayed);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  ASSERT_EQ(relayed.heartbeats_size(), 2);
  ASSERT_EQ(relayed.reports_size(), 1);
  // The same calls made directly now (nothing acknowledged in between: the
  // same orders are due) get the same answers.
  for (int i = 0; i < 2; ++i) {
    const v1::RelayedHeartbeat& item = relayed.heartbeats(i);
    ASSERT_EQ(item.status().code(), 0) << item.status().message();
    v1::HeartbeatResponse direct;
    ASSERT_TRUE(Direct(batch.heartbeats(i), &direct).ok());
    EXPECT_GT(direct.orders_size(), 0);
    EXPECT_EQ(direct.assignments_size(), 1);
    EXPECT_NE(direct.incarnation(), 0u);
    EXPECT_TRUE(MessageDifferencer::Equals(item.response(), direct))
        << "relayed: " << item.response().ShortDebugString()
        << "\ndirect: " << direct.ShortDebugString();
  }
  ASSERT_EQ(relayed.reports(0).status().code(), 0);
  v1::ReportShardsResponse direct;
  ASSERT_TRUE(Direct(batch.reports(0), &direct).ok());
  EXPECT_EQ(direct.results_size(), 2);
  EXPECT_TRUE(MessageDifferencer::Equals(relayed.reports(0).response(), direct))
      << "relayed: " << relayed.reports(0).response().ShortDebugString()
      << "\ndirect: " << direct.ShortDebugString();
  // The metrics tell the two paths apart: an operator sizing relays sees
  // how many node calls still come directly.
  const std::string text = prometheus::TextSerializer().Serialize(
      server_->coordinator()->options().metrics->Collect());
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_relayed_items_total",
                        {{"kind", "heartbeat"}, {"outcome", "applied"}}),
            2.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_relayed_items_total",
                        {{"kind", "report"}, {"outcome", "applied"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_direct_calls_total",
                        {{"kind", "heartbeat"}}),
            2.0);
  EXPECT_EQ(SampleValue(text, "ckpt_coordinator_direct_calls_total",
                        {{"kind", "report"}}),
            1.0);
}

TEST_F(RelayTest, ReportBatchesThroughARelayCommitAStep) {
  const uint64_t e1 = Register("n1"), e2 = Register("n2");
  RegisterJob(4);
  for (v1::ShardState state : {v1::STAGED, v1::DURABLE}) {
    v1::RelayBatchRequest batch;
    batch.set_relay_id("rack-1");
    *batch.add_reports() = NodeBatch("n1", e1, 7, {0, 1}, state);
    *batch.add_reports() = NodeBatch("n2", e2, 7, {2, 3}, state);
    v1::RelayBatchResponse resp;
    grpc::Status s = Relay(batch, &resp);
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    ASSERT_EQ(resp.reports_size(), 2);
    for (const v1::RelayedReports& r : resp.reports()) {
      ASSERT_EQ(r.status().code(), 0) << r.status().message();
      ASSERT_EQ(r.response().results_size(), 2);
      for (const v1::ReportResult& res : r.response().results())
        EXPECT_EQ(res.code(), 0) << res.message();
    }
    // Both nodes' calls in one group: the answer already says whether the
    // step is everywhere.
    EXPECT_EQ(resp.reports(1).response().results(1).durable_everywhere(),
              state == v1::DURABLE);
  }
  // Answered after the commit: the step is the job's last good one.
  EXPECT_TRUE(Job().has_last_good());
  EXPECT_EQ(Job().last_good_step(), 7u);
}

TEST_F(RelayTest, ABadItemIsRefusedByIndexAndTheOthersApplied) {
  const uint64_t e1 = Register("n1"), e2 = Register("n2");
  RegisterJob(4);
  v1::RelayBatchRequest batch;
  batch.set_relay_id("rack-1");
  *batch.add_heartbeats() = Beat("n1", e1);
  *batch.add_heartbeats() = Beat("bad node", e2);  // a space: not a node id
  *batch.add_heartbeats() = Beat("n2", e2);
  *batch.add_heartbeats() = Beat("n1", e1);  // n1's second in the batch
  *batch.add_reports() = NodeBatch("n1", e1, 5, {0, 1}, v1::STAGED);
  *batch.add_reports() = NodeBatch("", e2, 5, {2, 3}, v1::STAGED);
  v1::RelayBatchResponse resp;
  grpc::Status s = Relay(batch, &resp);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  ASSERT_EQ(resp.heartbeats_size(), 4);
  ASSERT_EQ(resp.reports_size(), 2);
  EXPECT_EQ(resp.heartbeats(0).status().code(), 0);
  EXPECT_EQ(resp.heartbeats(0).response().assignments_size(), 1);
  EXPECT_EQ(resp.heartbeats(2).status().code(), 0);
  EXPECT_EQ(resp.heartbeats(2).response().assignments_size(), 1);
  EXPECT_EQ(resp.heartbeats(1).status().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(
      resp.heartbeats(1).status().message().rfind("heartbeats[1].node_id: ", 0),
      0u)
      << resp.heartbeats(1).status().message();
  EXPECT_EQ(resp.heartbeats(3).status().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(resp.heartbeats(3).status().message(),
            "heartbeats[3].node_id: \"n1\" has a heartbeat in this batch "
            "already (heartbeats[0])");
  EXPECT_EQ(resp.reports(0).status().code(), 0);
  EXPECT_EQ(resp.reports(0).response().results_size(), 2);
  EXPECT_EQ(resp.reports(1).status().code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(resp.reports(1).status().message().rfind("reports[1].node_id: ", 0),
            0u)
      << resp.reports(1).status().message();
  // n1's report was applied: n2's STAGED reports now complete the step's
  // staging.
  v1::ReportShardsResponse direct;
  ASSERT_TRUE(Direct(NodeBatch("n2", e2, 5, {2, 3}, v1::STAGED), &direct).ok());
  ASSERT_EQ(direct.results_size(), 2);
  EXPECT_TRUE(direct.results(1).staged_everywhere());

  // The batch's own fields: the whole batch refused, naming the field.
  v1::RelayBatchRequest unnamed = batch;
  unnamed.set_relay_id("");
  s = Relay(unnamed, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "relay_id: empty");
  v1::RelayBatchRequest large;
  large.set_relay_id("rack-1");
  for (int i = 0; i <= Coordinator::kMaxRelayHeartbeats; ++i)
    *large.add_heartbeats() = Beat("n1", e1);
  s = Relay(large, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "heartbeats: 4097 items in one batch, more than 4096");
}

TEST_F(RelayTest, AFencedEpochItemIsRefusedAsTheDirectCall) {
  const uint64_t old = Register("n1"), e2 = Register("n2");
  // n1's ckptd restarted: its old epoch is fenced.
  v1::RegisterNodeRequest again;
  again.set_node_id("n1");
  again.set_address("127.0.0.1:1");
  again.set_capacity(2);
  again.set_previous_epoch(old);
  ASSERT_TRUE(server_->coordinator()->RegisterNode(again).ok());
  v1::RelayBatchRequest batch;
  batch.set_relay_id("rack-1");
  *batch.add_heartbeats() = Beat("n1", old);
  *batch.add_heartbeats() = Beat("n2", e2);
  *batch.add_reports() = NodeBatch("n1", old, 5, {0}, v1::STAGED);
  v1::RelayBatchResponse resp;
  grpc::Status s = Relay(batch, &resp);
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  v1::HeartbeatResponse ignored;
  grpc::Status direct = Direct(batch.heartbeats(0), &ignored);
  EXPECT_EQ(direct.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(resp.heartbeats(0).status().code(),
            static_cast<int>(direct.error_code()));
  EXPECT_EQ(resp.heartbeats(0).status().message(), direct.error_message());
  EXPECT_EQ(resp.heartbeats(1).status().code(), 0);  // the other goes on
  v1::ReportShardsResponse no;
  direct = Direct(batch.reports(0), &no);
  EXPECT_EQ(direct.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(resp.reports(0).status().code(),
            static_cast<int>(direct.error_code()));
  EXPECT_EQ(resp.reports(0).status().message(), direct.error_message());
}

TEST_F(RelayTest, AShedBatchStillKeepsItsNodesAlive) {
  const uint64_t e1 = Register("n1"), e2 = Register("n2");
  server_->SetMaxQueuedRelayBatches(0);  // every batch shed
  v1::RelayBatchRequest batch;
  batch.set_relay_id("rack-1");
  *batch.add_heartbeats() = Beat("n1", e1);
  *batch.add_heartbeats() = Beat("n2", e2);
  // Three heartbeat timeouts pass on the coordinator's clock, half a
  // timeout a step, the nodes heard only through shed batches.
  Coordinator* c = server_->coordinator();
  for (int i = 0; i < 6; ++i) {
    v1::RelayBatchResponse resp;
    std::string retry_after;
    grpc::Status s = Relay(batch, &resp, &retry_after);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s.error_message();
    EXPECT_NE(s.error_message().find("retry after"), std::string::npos);
    EXPECT_FALSE(retry_after.empty());
    skew_ms_ += heartbeat_timeout_ms_ / 2;
  }
  ASSERT_TRUE(c->Tick().ok());
  EXPECT_EQ(Node("n1").health(), v1::ALIVE);
  EXPECT_EQ(Node("n2").health(), v1::ALIVE);
  EXPECT_EQ(CountEvents(v1::FAILURE_DETECTED), 0);
  // Admitted again: applied.
  server_->SetMaxQueuedRelayBatches(16);
  v1::RelayBatchResponse resp;
  ASSERT_TRUE(Relay(batch, &resp).ok());
  EXPECT_EQ(resp.heartbeats(0).status().code(), 0);
}

// The counts ckpt-relay's service watchdog reads (relay/main.cc): a call is
// gathered when it arrives and answered once its batch came back, so
// nothing waits after the node's answer; and a batch may take 30 s per
// replica before anything counts as stuck.
TEST_F(RelayTest, TheRelayCountsCallsGatheredAndAnsweredForItsWatchdog) {
  const uint64_t e1 = Register("n1");
  RelayOptions o;
  o.listen = "127.0.0.1:0";
  o.coordinator = Address() + ",127.0.0.1:1";
  o.relay_id = "rack-1";
  auto relay = ckpt::coordinator::Relay::Start(o, nullptr);
  ASSERT_TRUE(relay.ok()) << relay.status();
  EXPECT_EQ((*relay)->longest_send(), o.gather + std::chrono::seconds(60));
  EXPECT_EQ((*relay)->progress().gathered, 0u);
  auto via = v1::Coordinator::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string((*relay)->port()),
                          grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(20));
    v1::HeartbeatResponse resp;
    grpc::Status s = via->Heartbeat(&ctx, Beat("n1", e1), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // Counted before the node's answer went out.
  const ckpt::coordinator::Relay::Progress p = (*relay)->progress();
  EXPECT_EQ(p.gathered, 3u);
  EXPECT_EQ(p.answered, 3u);
  EXPECT_TRUE((*relay)->coordinator_answers());
}

}  // namespace
}  // namespace ckpt::coordinator
