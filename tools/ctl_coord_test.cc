// Runs the real ckptctl binary against the real ckpt-coordinator binary:
// cluster, rollback, resume, events, stacks, cordon, and the errors a script
// relies on.
#include <gtest/gtest.h>

#include <string>

#include "tests/temp_dir.h"
#include "tools/ckptrun_testing.h"

namespace ckpt::tools {
namespace {

using testing::CommandResult;
using testing::RunCommand;

class CtlCoordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coord_ = std::make_unique<testing::CoordinatorProcess>(
        dir_.path() + "/state", dir_.path() + "/shared", 5000);
    ASSERT_GT(coord_->port(), 0);
  }
  CommandResult Ctl(const std::string& args, bool with_stderr = false) {
    return RunCommand(std::string(CKPTCTL_PATH) + " " + args, with_stderr);
  }
  std::string Flag() const { return "--coordinator " + coord_->address(); }
  // Registers job "train" of `world` ranks with the coordinator.
  grpc::Status RegisterTrain(uint32_t world) {
    auto stub = coord_->Stub();
    grpc::ClientContext ctx;
    testing::cv1::RegisterJobRequest req;
    req.set_job("train");
    req.set_world_size(world);
    testing::cv1::RegisterJobResponse resp;
    return stub->RegisterJob(&ctx, req, &resp);
  }

  ckpt::testing::TempDir dir_;
  std::unique_ptr<testing::CoordinatorProcess> coord_;
};

TEST_F(CtlCoordTest, CordonShowsAsANodeMarkAndAnEventUntilUncordoned) {
  testing::FakeNode node(coord_->address(), "n1", "10.0.0.7:50051", 2);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  CommandResult r = Ctl(Flag() + " cordon n1 --reason 'bad disk' --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out,
            "{\"node_id\":\"n1\",\"cordoned\":true,\"changed\":true,"
            "\"reason\":\"bad disk\"}\n");
  r = Ctl(Flag() + " cluster --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(R"("cordoned":true,"cordon_reason":"bad disk",)"
                       R"("unhealthy":false,"unhealthy_check":"",)"
                       R"("unhealthy_reason":"","stragglers":[])"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"("kind":"CORDONED")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("reason":"bad disk","by":"operator")"),
            std::string::npos)
      << r.out;
  r = Ctl(Flag() + " cluster");
  EXPECT_NE(r.out.find("cordoned (bad disk)"), std::string::npos) << r.out;
  r = Ctl(Flag() + " uncordon n1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "node n1 uncordoned (a spare: it may take ranks)\n");
  r = Ctl(Flag() + " cluster --json");
  EXPECT_NE(r.out.find(R"("cordoned":false,"cordon_reason":"")"),
            std::string::npos)
      << r.out;
}

TEST_F(CtlCoordTest, ClusterJsonShowsRegisteredNodeAndRankPlacement) {
  testing::FakeNode node(coord_->address(), "n1", "10.0.0.7:50051", 2);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  {
    grpc::Status s = RegisterTrain(2);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  CommandResult r = Ctl(Flag() + " cluster --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(
      r.out.find(
          R"("node_id":"n1","address":"10.0.0.7:50051","health":"ALIVE")"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          R"("job":"train","world_size":2,"rank_node":["n1","n1"],"last_good_step":null)"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"("plan_state":"PLAN_NONE")"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"("generation":0)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("last_good_manifest":null)"), std::string::npos)
      << r.out;
  // Elastic continuation: not elastic (the coordinator's default), at its
  // registered size, restoring no other world size.
  EXPECT_NE(
      r.out.find(
          R"("full_world_size":2,"min_world_size":0,"world_size_multiple":1,"restore_world_size":0,"restore_ranks":[])"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"("kind":"JOB_REGISTERED")"), std::string::npos)
      << r.out;

  r = Ctl(Flag() + " cluster");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("0-1:n1"), std::string::npos) << r.out;

  // Event 1 is n1's registration, event 2 the job's.
  r = Ctl(Flag() + " events --job train --after 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(R"("seq":2,)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("kind":"JOB_REGISTERED")"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("NODE_REGISTERED"), std::string::npos) << r.out;
}

// Each node's domain and replica target, and per job the step it
// restores from memory and how many ranks have a replica.
TEST_F(CtlCoordTest, ClusterShowsDomainsReplicaTargetsAndTheMemoryStep) {
  testing::FakeNode n1(coord_->address(), "n1", "10.0.0.1:1", 1, false,
                       "rack-a", 7001);
  testing::FakeNode n2(coord_->address(), "n2", "10.0.0.2:1", 1, false,
                       "rack-b", 7002);
  ASSERT_TRUE(n1.status().ok() && n2.status().ok());
  ASSERT_TRUE(RegisterTrain(2).ok());
  ASSERT_TRUE(n1.ReportShard("train", 3, 0, testing::cv1::STAGED, "").ok());
  ASSERT_TRUE(n2.ReportShard("train", 3, 1, testing::cv1::STAGED, "").ok());
  grpc::Status s = n2.ReportReplica("train", 3, 0, "n1");
  ASSERT_TRUE(s.ok()) << s.error_message();
  CommandResult r = Ctl(Flag() + " cluster --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(R"("stragglers":[],"domain":"rack-a",)"
                       R"("replica_port":7001,"replica_target":"n2"})"),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          R"("memory_step":3,"replicated_ranks":1,"replicated_step":null})"),
      std::string::npos)
      << r.out;
  r = Ctl(Flag() + " cluster");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* want : {"REPLICAS_TO", "rack-b", "IN_MEMORY", "1/2"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // Rank 1's copy too: step 3 survives the loss of either node.
  s = n1.ReportReplica("train", 3, 1, "n2");
  ASSERT_TRUE(s.ok()) << s.error_message();
  r = Ctl(Flag() + " cluster --json");
  EXPECT_NE(r.out.find(R"("replicated_ranks":2,"replicated_step":3})"),
            std::string::npos)
      << r.out;
  r = Ctl(Flag() + " cluster");
  for (const char* want : {"REPLICA_STEP", "2/2"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;

  // A plan says what its restore step saved (here: a trainer crash, every
  // rank in its host's memory; storage alone has nothing).
  {
    auto stub = coord_->Stub();
    grpc::ClientContext ctx;
    testing::cv1::ReportTrainerExitRequest exit;
    exit.set_node_id("n1");
    exit.set_epoch(n1.epoch());
    exit.set_job("train");
    exit.set_rank(0);
    exit.set_term_signal(9);
    testing::cv1::ReportTrainerExitResponse resp;
    ASSERT_TRUE(stub->ReportTrainerExit(&ctx, exit, &resp).ok());
  }
  r = Ctl(Flag() + " events --job train --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(R"("kind":"RESTORE_SOURCES")"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"("restore":{"generation":1,"step":3,)"
                       R"("from_memory":false,"newest_step":3,)"
                       R"("durable_step":null,"steps_lost":0,)"
                       R"("steps_lost_durable":3,"ranks":[]})"),
            std::string::npos)
      << r.out;
}

// A restore that fell back shows in `events` as FALLBACK, with
// its copy, step and reason (text and --json).
TEST_F(CtlCoordTest, EventsShowAFallbackWithItsCopyStepAndReason) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  auto stub = coord_->Stub();
  ASSERT_TRUE(RegisterTrain(1).ok());
  {
    grpc::ClientContext ctx;
    testing::cv1::ReportFallbackRequest req;
    req.set_node_id("n1");
    req.set_epoch(node.epoch());
    req.set_job("train");
    req.set_step(40);
    req.set_rank(0);
    req.set_copy("memory");
    req.set_reason("checksum mismatch in tensor w");
    req.set_next_step(30);
    req.set_next_copy("file");
    testing::cv1::ReportFallbackResponse resp;
    grpc::Status s = stub->ReportFallback(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  CommandResult r = Ctl(Flag() + " events --job train --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(
      r.out.find(
          R"("node_id":"n1","kind":"FALLBACK","detail":"rank 0 step 40: memory copy failed )"
          R"(verification (checksum mismatch in tensor w); fell back to step 30 from file")"),
      std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find(
          R"("fallback":{"rank":0,"step":40,"copy":"memory","reason":"checksum mismatch in )"
          R"(tensor w","next_step":30,"next_copy":"file"})"),
      std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find(R"("fallback")"), r.out.rfind(R"("fallback")"))
      << "only FALLBACK events carry one: " << r.out;

  r = Ctl(Flag() + " events --job train");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("FALLBACK"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find(
          "memory copy failed verification (checksum mismatch in tensor w)"),
      std::string::npos)
      << r.out;
}

TEST_F(CtlCoordTest, StacksShowWhatALauncherCapturedAndRefuseOtherGenerations) {
  testing::FakeNode node(coord_->address(), "n1", "10.0.0.7:50051", 2);
  ASSERT_TRUE(node.status().ok()) << node.status().error_message();
  ASSERT_TRUE(RegisterTrain(2).ok());
  CommandResult none = Ctl(Flag() + " stacks --job train");
  ASSERT_EQ(none.exit_code, 0) << none.out;
  EXPECT_NE(none.out.find("no stacks kept for job train"), std::string::npos);
  {
    auto stub = coord_->Stub();
    grpc::ClientContext ctx;
    testing::cv1::ReportStacksRequest req;
    req.set_node_id("n1");
    req.set_job("train");
    req.set_generation(0);
    auto* r = req.add_ranks();
    r->set_rank(1);
    r->set_pid(4242);
    r->set_tool("gdb");
    r->set_text("#0  0x1 in pause ()\n");
    testing::cv1::ReportStacksResponse resp;
    grpc::Status s = stub->ReportStacks(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  CommandResult text = Ctl(Flag() + " stacks --job train");
  ASSERT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("generation 0 node n1 rank 1 (pid 4242, gdb)"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("#0  0x1 in pause ()"), std::string::npos);
  CommandResult json =
      Ctl(Flag() + " stacks --job train --generation 0 --json");
  ASSERT_EQ(json.exit_code, 0) << json.out;
  EXPECT_NE(
      json.out.find(
          R"("rank":1,"pid":4242,"tool":"gdb","text":"#0  0x1 in pause ()\n")"),
      std::string::npos)
      << json.out;
  CommandResult events = Ctl(Flag() + " events --job train --json");
  EXPECT_NE(events.out.find(R"("kind":"STACKS_CAPTURED")"), std::string::npos)
      << events.out;
  CommandResult other =
      Ctl(Flag() + " stacks --job train --generation 3", /*with_stderr=*/true);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.out.find("generation: 3 of job train has no stacks kept"),
            std::string::npos)
      << other.out;
}

TEST_F(CtlCoordTest, RollbackToStepThatIsNotDurableIsRefusedWithServerMessage) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  ASSERT_TRUE(RegisterTrain(1).ok());
  CommandResult r = Ctl(Flag() + " rollback --job train --step 9", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("ckptctl rollback: Rollback to coordinator"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("step: 9 of job train is not durable"),
            std::string::npos)
      << r.out;

  r = Ctl(Flag() + " rollback --job nosuchjob --step 1", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not registered"), std::string::npos) << r.out;
}

// A job whose trainer keeps failing without a commit is held after
// --max-failed-plans (10) plans: cluster shows it, resume plans again, and
// resuming a job that is not held is refused naming it.
TEST_F(CtlCoordTest, AHeldJobIsShownAndResumedAndOnlyAHeldJobResumes) {
  testing::FakeNode node(coord_->address(), "n1", "", 1);
  ASSERT_TRUE(node.status().ok());
  ASSERT_TRUE(RegisterTrain(1).ok());
  CommandResult r = Ctl(Flag() + " resume --job train", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("job: train is not held"), std::string::npos) << r.out;
  r = Ctl(Flag() + " resume --job nosuchjob", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not registered"), std::string::npos) << r.out;
  auto stub = coord_->Stub();
  for (int i = 0; i < 11; ++i) {
    grpc::ClientContext ctx;
    testing::cv1::ReportTrainerExitRequest exit;
    exit.set_node_id("n1");
    exit.set_epoch(node.epoch());
    exit.set_job("train");
    exit.set_rank(0);
    exit.set_exit_code(1);
    testing::cv1::ReportTrainerExitResponse resp;
    ASSERT_TRUE(stub->ReportTrainerExit(&ctx, exit, &resp).ok());
  }
  r = Ctl(Flag() + " cluster");
  EXPECT_NE(r.out.find("PLAN_HELD"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("job train is HELD: held in generation 11: 10 plans "
                       "without a commit"),
            std::string::npos)
      << r.out;
  r = Ctl(Flag() + " cluster --json");
  EXPECT_NE(r.out.find(R"("plans_since_commit":10,"held":true)"),
            std::string::npos)
      << r.out;
  r = Ctl(Flag() + " events --job train");
  EXPECT_NE(r.out.find("JOB_HELD"), std::string::npos) << r.out;
  r = Ctl(Flag() + " resume --job train", true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("job train resumed: generation 12 plans again"),
            std::string::npos)
      << r.out;
  r = Ctl(Flag() + " cluster --json");
  EXPECT_NE(r.out.find(R"("plans_since_commit":1,"held":false)"),
            std::string::npos)
      << r.out;
}

TEST_F(CtlCoordTest, UnreachableCoordinatorFailsCleanly) {
  // Port 1 on loopback: nothing listens there, the connection is refused.
  CommandResult r = Ctl("--coordinator 127.0.0.1:1 cluster", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("GetCluster to coordinator 127.0.0.1:1"),
            std::string::npos)
      << r.out;
}

TEST_F(CtlCoordTest, MissingOrMalformedCoordinatorFlagIsAUsageError) {
  for (const char* args :
       {"cluster", "events --json", "rollback --job j --step 1"}) {
    CommandResult r = Ctl(args, true);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("--coordinator"), std::string::npos)
        << args << ": " << r.out;
  }
  for (const char* addr :
       {"localhost", "host:0", "host:99999", ":5000", "host:abc", "::1:5000"}) {
    CommandResult r =
        Ctl(std::string("--coordinator ") + addr + " cluster", true);
    EXPECT_EQ(r.exit_code, 2) << addr << ": " << r.out;
    EXPECT_NE(r.out.find("--coordinator"), std::string::npos)
        << addr << ": " << r.out;
  }
  CommandResult r = Ctl(Flag() + " rollback --job 'bad/name' --step 1", true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--job"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ckpt::tools
