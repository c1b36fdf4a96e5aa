// A refused heartbeat is never evidence of death: a node whose heartbeats
// the coordinator itself could not take (its threads busy with calls that
// wait for a slow disk, or its own admission shedding them) is not declared
// dead for it, while a node that really goes silent still is.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "coordinator.grpc.pb.h"
#include "coordinator/coordinator_testing.h"
#include "coordinator/server_testing.h"

namespace ckpt::coordinator {
namespace {

// A server whose disk writes can be held (the group committer waits in
// Write until released), so every call that waits for durability waits.
class HearingTest : public ServerTest {
 protected:
  void StartHeld() {
    Start(0, 16, [this](const std::vector<const KvBatch*>&) {
      std::unique_lock<std::mutex> lock(hold_mu_);
      if (hold_) {
        writer_held_ = true;
        hold_cv_.notify_all();
        hold_cv_.wait(lock, [this] { return !hold_; });
      }
      return FaultyKv::Fault::kNone;
    });
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(Address(), grpc::InsecureChannelCredentials()));
  }
  // The server goes before this fixture's members: its group committer
  // calls the hold rule above, which reads them (the base class would
  // stop the server only after they are destroyed).
  void TearDown() override {
    Release();
    stub_.reset();
    faulty_ = nullptr;
    server_.reset();
  }
  void Hold() {
    std::lock_guard<std::mutex> lock(hold_mu_);
    hold_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(hold_mu_);
    hold_ = false;
    hold_cv_.notify_all();
  }
  bool WriterHeld() {
    std::lock_guard<std::mutex> lock(hold_mu_);
    return writer_held_;
  }
  uint64_t RegisterNode(const std::string& id) {
    v1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.set_capacity(2);
    v1::RegisterNodeResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->RegisterNode(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.epoch();
  }
  grpc::Status Heartbeat(const std::string& id, uint64_t epoch,
                         std::string* retry_after = nullptr) {
    v1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_epoch(epoch);
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
    if (retry_after) {
      auto it = ctx.GetServerTrailingMetadata().find("ckpt-retry-after-ms");
      if (it != ctx.GetServerTrailingMetadata().end())
        *retry_after = std::string(it->second.data(), it->second.size());
    }
    return s;
  }
  v1::NodeHealth Health(const std::string& id) {
    const v1::GetClusterResponse c = server_->coordinator()->GetCluster();
    for (const auto& n : c.nodes())
      if (n.node_id() == id) return n.health();
    return v1::NODE_HEALTH_UNSPECIFIED;
  }
  std::string DeadReason(const std::string& id) {
    const v1::GetClusterResponse c = server_->coordinator()->GetCluster();
    for (const auto& n : c.nodes())
      if (n.node_id() == id) return n.dead_reason();
    return "";
  }
  int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool hold_ = false;
  bool writer_held_ = false;
};

// Registrations that wait for a held disk write take every thread the
// server may run; the node keeps heartbeating the whole time.
TEST_F(HearingTest, HeartbeatsAreHeardWhileRegistrationsWaitForTheDisk) {
  max_threads_ = 4;
  StartHeld();
  const uint64_t epoch = RegisterNode("n1");
  ASSERT_TRUE(Heartbeat("n1", epoch).ok());
  Hold();
  // A registration storm: each waits for its write, which waits for us.
  struct Pending {
    grpc::ClientContext ctx;
    v1::RegisterNodeRequest req;
    v1::RegisterNodeResponse resp;
  };
  std::vector<std::unique_ptr<Pending>> storm(12);
  std::atomic<int> answered{0};
  for (size_t i = 0; i < storm.size(); ++i) {
    storm[i] = std::make_unique<Pending>();
    storm[i]->req.set_node_id("s" + std::to_string(i));
    storm[i]->req.set_capacity(2);
    stub_->async()->RegisterNode(&storm[i]->ctx, &storm[i]->req,
                                 &storm[i]->resp,
                                 [&answered](grpc::Status) { ++answered; });
  }
  ASSERT_TRUE(Eventually([&] { return WriterHeld(); }));
  // Heartbeats for twice the timeout, as often as the test polls.
  const int64_t until = NowMs() + 2 * heartbeat_timeout_ms_;
  int refused = 0, sent = 0;
  std::string last_refusal;
  ASSERT_TRUE(Eventually([&] {
    grpc::Status s = Heartbeat("n1", epoch);
    ++sent;
    if (!s.ok()) {
      ++refused;
      last_refusal = s.error_message();
    }
    return NowMs() > until;
  }));
  EXPECT_EQ(Health("n1"), v1::ALIVE)
      << "n1 declared dead (" << DeadReason("n1") << ") after " << refused
      << " of " << sent << " heartbeats were refused: " << last_refusal;
  Release();
  for (auto& p : storm) p->ctx.TryCancel();
  ASSERT_TRUE(Eventually([&] { return answered == int(storm.size()); }));
}

// A registration answered only once durable: a node cannot heartbeat
// before it has its epoch, so a slow group commit (a registration storm)
// must not count as its silence.
TEST_F(HearingTest, NodeIsNotJudgedBeforeItsRegistrationIsAnswered) {
  StartHeld();
  const uint64_t n1 = RegisterNode("n1");
  Hold();
  grpc::ClientContext ctx;
  v1::RegisterNodeRequest req;
  req.set_node_id("n2");
  req.set_capacity(2);
  v1::RegisterNodeResponse resp;
  std::atomic<bool> done{false};
  grpc::Status status;
  stub_->async()->RegisterNode(&ctx, &req, &resp, [&](grpc::Status s) {
    status = s;
    done = true;
  });
  ASSERT_TRUE(Eventually([&] { return WriterHeld(); }));
  // Longer than the timeout with n2's registration unanswered; n1 keeps
  // heartbeating (its heartbeats need no durable write).
  const int64_t until = NowMs() + 2 * heartbeat_timeout_ms_;
  ASSERT_TRUE(Eventually([&] {
    EXPECT_TRUE(Heartbeat("n1", n1).ok());
    return NowMs() > until;
  }));
  EXPECT_EQ(Health("n2"), v1::ALIVE) << DeadReason("n2");
  Release();
  ASSERT_TRUE(Eventually([&] { return done.load(); }));
  ASSERT_TRUE(status.ok()) << status.error_message();
  grpc::Status hb = Heartbeat("n2", resp.epoch());
  EXPECT_TRUE(hb.ok()) << "n2's first heartbeat after its registration: "
                       << hb.error_message();
}

// The coordinator's own admission sheds every heartbeat: each refusal says
// when to come back, and the node is not declared dead for it; a node that
// stops heartbeating altogether still is, within its timeout.
TEST_F(HearingTest, ShedHeartbeatsKeepTheNodeAliveSilenceStillKills) {
  StartHeld();
  const uint64_t n1 = RegisterNode("n1");
  const uint64_t n2 = RegisterNode("n2");
  ASSERT_TRUE(Heartbeat("n2", n2).ok());
  server_->SetMaxQueuedHeartbeats(0);
  const int64_t since = NowMs();
  std::string retry_after;
  grpc::Status refusal;
  ASSERT_TRUE(Eventually([&] {
    refusal = Heartbeat("n1", n1, &retry_after);
    EXPECT_EQ(refusal.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << refusal.error_message();
    return Health("n2") == v1::DEAD;
  }));
  // n2 fell silent and died in about its timeout; n1, only refused, lives.
  EXPECT_GE(NowMs() - since, heartbeat_timeout_ms_ / 2);
  EXPECT_NE(DeadReason("n2").find("no heartbeat for"), std::string::npos)
      << DeadReason("n2");
  EXPECT_EQ(Health("n1"), v1::ALIVE) << DeadReason("n1");
  ASSERT_FALSE(retry_after.empty()) << "no ckpt-retry-after-ms trailer";
  EXPECT_GT(std::stoi(retry_after), 0);
  server_->SetMaxQueuedHeartbeats(1024);
  EXPECT_TRUE(Heartbeat("n1", n1).ok());
}

// A spell during which the coordinator could not hear (a late failure
// detector, a state load) restarts every node's window when it ends: a
// node heard again within the timeout after it lives, even though its
// last heartbeat before the spell is older than the timeout; one silent
// for the whole timeout after the spell dies then, not later.
TEST_F(CoordinatorTest, SilenceWhileTheCoordinatorWasDeafIsNoOnesDeath) {
  const uint64_t e1 = Register("n1", 2);
  Register("n2", 2);
  now_ms_ += 2 * heartbeat_timeout_ms_;  // deaf all this time
  coord_->hearing().RestartWindows("test: the process was stopped");
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n1").health(), v1::ALIVE) << Node("n1").dead_reason();
  EXPECT_EQ(Node("n2").health(), v1::ALIVE) << Node("n2").dead_reason();
  now_ms_ += heartbeat_timeout_ms_ - 1;
  ASSERT_TRUE(Heartbeat("n1", e1).ok());  // heard: its window moves
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::ALIVE) << Node("n2").dead_reason();
  now_ms_ += 2;  // n2: the whole timeout silent since hearing recovered
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n2").health(), v1::DEAD);
  EXPECT_NE(Node("n2").dead_reason().find("no heartbeat for"),
            std::string::npos)
      << Node("n2").dead_reason();
  EXPECT_EQ(Node("n1").health(), v1::ALIVE) << Node("n1").dead_reason();
  EXPECT_EQ(coord_->hearing().stats().deaf_spells, 1u);
}

// The agent heartbeats one call at a time: while the coordinator has not
// answered a heartbeat it heard (the call waits in the heartbeat queue
// behind the state lock, say while a registration storm holds it), the
// node sends no other. That silence is the coordinator's: the node's
// window starts when it is answered. A heartbeat never answered excuses
// its node for one timeout only, so a node that dies with its heartbeat
// stuck is still declared dead, within twice the timeout of it.
TEST_F(CoordinatorTest, SilenceWhileAHeartbeatAwaitsItsAnswerIsNoOnesDeath) {
  const uint64_t e1 = Register("n1", 2);
  Register("n2", 2);
  const int64_t timeout = heartbeat_timeout_ms_;
  coord_->Heard("n1", e1);  // arrived; its answer waits in the queue
  now_ms_ += timeout + timeout / 2;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n1").health(), v1::ALIVE)
      << "n1 declared dead while its heartbeat waited for an answer: "
      << Node("n1").dead_reason();
  EXPECT_EQ(Node("n2").health(), v1::DEAD) << "n2 was really silent";
  ASSERT_TRUE(Heartbeat("n1", e1).ok());  // the worker answers it now
  now_ms_ += timeout;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n1").health(), v1::ALIVE) << Node("n1").dead_reason();
  // Silent for the whole timeout after its answer: dead then, not later.
  now_ms_ += 1;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n1").health(), v1::DEAD);
  EXPECT_NE(Node("n1").dead_reason().find("no heartbeat for"),
            std::string::npos)
      << Node("n1").dead_reason();
  // n3's heartbeat is heard and never answered (the coordinator stalls
  // on it): the excuse ends one timeout after it came.
  const uint64_t e3 = Register("n3", 2);
  coord_->Heard("n3", e3);
  now_ms_ += 2 * timeout;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n3").health(), v1::ALIVE) << Node("n3").dead_reason();
  now_ms_ += 1;
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Node("n3").health(), v1::DEAD);
}

}  // namespace
}  // namespace ckpt::coordinator
