// A restarted ckptd tells the coordinator what it recovered: the shards
// its catalog kept were reported under an epoch of its previous life, and
// the coordinator forgot them when that life ended. After its first
// registration the node agent reports them again (STAGED, then DURABLE),
// so a step that became durable across the restart still commits. A real
// coordinator on loopback (coordinator/server_testing.h), a real node
// agent and the engine in-process over a local root.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <mutex>

#include "coordinator/server_testing.h"
#include "daemon/agent/node_agent.h"
#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "tests/engine_save.h"
#include "tests/gated_backend.h"
#include "tests/harness.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;

class RecoveredReportTest : public coordinator::ServerTest {
 protected:
  void TearDown() override {
    StopDaemon();
    UnlinkArenas(prefix_);
  }
  // ckptd "n1": its engine (recovering from the catalog, if any) and its
  // agent, which registers with the coordinator.
  void StartDaemon() {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/shared";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    gate_ = std::make_unique<GatedBackend>(local_.get());
    auto cat = daemon::Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.node_id = "n1";
    eo.on_shard = [this](const daemon::ShardReport& r) {
      std::lock_guard<std::mutex> l(agent_mu_);
      if (agent_) agent_->Report(r);
    };
    auto e = daemon::Engine::Open(eo, gate_.get(), catalog_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    daemon::NodeAgentOptions o;
    o.coordinator = Address();
    o.node_id = "n1";
    o.address = "127.0.0.1:1";
    o.capacity = 2;
    o.rpc_timeout = std::chrono::milliseconds(2000);
    o.epoch_file = dir_.path() + "/node-epoch";
    auto agent = std::make_shared<daemon::NodeAgent>(o);
    {
      std::lock_guard<std::mutex> l(agent_mu_);
      agent_ = agent;
    }
    agent->Start(engine_.get());
  }
  // The agent goes first: nothing the engine does afterwards is reported.
  void StopAgent() {
    std::shared_ptr<daemon::NodeAgent> agent;
    {
      std::lock_guard<std::mutex> l(agent_mu_);
      agent = std::move(agent_);
    }
  }
  void StopDaemon() {
    StopAgent();
    if (gate_) gate_->Open();
    engine_.reset();
    catalog_.reset();
    gate_.reset();
    local_.reset();
    arena_.reset();
  }
  uint64_t Epoch() {
    std::lock_guard<std::mutex> l(agent_mu_);
    return agent_ ? agent_->epoch() : 0;
  }
  std::shared_ptr<daemon::NodeAgent> RunningAgent() {
    std::lock_guard<std::mutex> l(agent_mu_);
    return agent_;
  }
  // Step 3 of "job" (rank 0 of 1) saved in `generation` and reported
  // STAGED; the daemon then stops while its persist is held, and the
  // persist ends unreported: the catalog records step 3 durable.
  void SaveStep3AndStopBeforeItsPersistIsReported(uint64_t generation) {
    gate_->Close();
    ASSERT_TRUE(
        SaveOneTensorStep(
            engine_.get(), peer_,
            {.job = "job", .step = 3, .block = true, .generation = generation},
            &arena_)
            .ok());
    ASSERT_TRUE(Eventually([&] {
      return CountEvents(cv1::STEP_STAGED, "step 3") == 1;
    })) << "step 3 was never staged";
    StopAgent();
    gate_->Open();
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));
    StopDaemon();
  }

  const std::string prefix_ = UniqueShmPrefix();
  const daemon::PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<GatedBackend> gate_;
  std::unique_ptr<daemon::Catalog> catalog_;
  std::unique_ptr<daemon::Engine> engine_;
  std::unique_ptr<shm::Arena> arena_;
  std::mutex agent_mu_;
  std::shared_ptr<daemon::NodeAgent> agent_;
};

// On one node: step 3 is staged and reported, the
// daemon dies while its persist is held (the persist ends unreported),
// and the restarted daemon recovers the step as durable from its catalog.
// The coordinator commits it only if the restarted daemon reports it.
TEST_F(RecoveredReportTest, StepDurableAcrossARestartIsReportedAndCommits) {
  Start();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > 0; }));
  const uint64_t first_epoch = Epoch();
  RegisterJob(1);
  gate_->Close();  // the persist of step 3 waits
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "job", .step = 3, .block = true},
                                &arena_)
                  .ok());
  ASSERT_TRUE(Eventually([&] {
    return CountEvents(cv1::STEP_STAGED, "step 3") == 1;
  })) << "step 3 was never staged";
  StopAgent();
  gate_->Open();
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));
  StopDaemon();  // the catalog records step 3 durable; nobody was told

  skew_ms_ += 10 * heartbeat_timeout_ms_;  // the old life timed out
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > first_epoch; }));
  EXPECT_TRUE(Eventually([&] {
    return Job().has_last_good() && Job().last_good_step() == 3;
  })) << "step 3, durable on the restarted node, never committed (last good "
      << (Job().has_last_good() ? std::to_string(Job().last_good_step())
                                : "none")
      << ")";
}

// A ckptd restarted within the heartbeat timeout (a crash, an upgrade)
// takes over from its previous life at once: it names the epoch that life
// was given, so it is the same node, not a second one claiming its id. No
// failure is declared and no plan made, so a save of the job's current
// generation (ckptrun's CKPT_GENERATION) that the restarted node recovered
// durable counts, and the step commits.
TEST_F(RecoveredReportTest,
       SaveOfTheCurrentGenerationCommitsAcrossARestartWithoutAPlan) {
  heartbeat_timeout_ms_ = 60000;  // the old life never times out here
  Start();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > 0; }));
  const uint64_t first_epoch = Epoch();
  RegisterJob(1);
  const uint64_t generation = Job().generation();
  ASSERT_NO_FATAL_FAILURE(
      SaveStep3AndStopBeforeItsPersistIsReported(generation));

  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > first_epoch; }))
      << "the restarted ckptd was not let in while its previous life (epoch "
      << first_epoch << ") had not timed out";
  EXPECT_TRUE(Eventually([&] {
    return Job().has_last_good() && Job().last_good_step() == 3;
  })) << "step 3 of generation "
      << generation
      << ", durable on the restarted node, never committed (last good "
      << (Job().has_last_good() ? std::to_string(Job().last_good_step())
                                : "none")
      << ")";
  EXPECT_EQ(Job().generation(), generation);
  EXPECT_EQ(CountEvents(cv1::PLAN_MADE), 0);
  EXPECT_EQ(CountEvents(cv1::FAILURE_DETECTED), 0);
}

// A save of a generation a plan abandoned while the ckptd was down stays
// refused when the restarted node reports it, naming the generation. (Its
// STAGED report never reached the coordinator, so the plan, made while the
// node was down, did not choose it.)
TEST_F(RecoveredReportTest, SaveOfAnAbandonedGenerationIsStillRefused) {
  heartbeat_timeout_ms_ = 60000;
  Start();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > 0; }));
  const uint64_t first_epoch = Epoch();
  RegisterJob(1);
  const uint64_t generation = Job().generation();
  StopAgent();
  gate_->Close();
  ASSERT_TRUE(
      SaveOneTensorStep(
          engine_.get(), peer_,
          {.job = "job", .step = 3, .block = true, .generation = generation},
          &arena_)
          .ok());
  gate_->Open();
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));
  StopDaemon();
  ASSERT_NO_FATAL_FAILURE(TrainerDied("n1", first_epoch, 0));  // a plan
  ASSERT_EQ(Job().generation(), generation + 1);
  ASSERT_FALSE(Job().has_restore_step()) << "the plan restores from scratch";

  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(Eventually([&] { return Epoch() > first_epoch; }));
  ASSERT_TRUE(
      Eventually([&] { return RunningAgent()->reports_refused() > 0; }));
  const std::string why = RunningAgent()->last_refusal();
  EXPECT_NE(why.find("generation: " + std::to_string(generation)),
            std::string::npos)
      << why;
  EXPECT_FALSE(Job().has_last_good() && Job().last_good_step() == 3);
}

}  // namespace
}  // namespace ckpt::testing
