// Elastic continuation against a real in-process Coordinator (fake clock):
// a job that loses a node no spare replaces shrinks to the largest allowed
// world size its live nodes hold, each new rank restoring a saved rank of
// the last good step, and grows back at its next commit.
#include <chrono>
#include <map>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class ElasticTest : public CoordinatorTest {
 protected:
  // `nodes` active nodes n1.. of `capacity` ranks each.
  void Nodes(int nodes, uint32_t capacity) {
    for (int i = 1; i <= nodes; ++i) {
      const std::string id = "n" + std::to_string(i);
      epochs_[id] = Register(id, capacity);
    }
  }
  absl::StatusOr<v1::RegisterJobResponse> RegisterElastic(
      uint32_t world, std::optional<uint32_t> min,
      std::optional<uint32_t> multiple, const std::string& job = "job") {
    v1::RegisterJobRequest req;
    req.set_job(job);
    req.set_world_size(world);
    if (min) req.set_min_world_size(*min);
    if (multiple) req.set_world_size_multiple(*multiple);
    return coord_->RegisterJob(req);
  }
  // Every rank of the job's layout now saves `step` from its host, staged
  // then durable: the step commits.
  void CommitStep(uint64_t step) {
    const v1::JobRecord job = Job();
    for (v1::ShardState state : {v1::STAGED, v1::DURABLE})
      for (uint32_t r = 0; r < job.world_size(); ++r) {
        const std::string& host = job.rank_node(r);
        auto s = Report(host, epochs_[host], step, r, state);
        ASSERT_TRUE(s.ok()) << s.status();
      }
    ASSERT_TRUE(Job().has_last_good());
    ASSERT_EQ(Job().last_good_step(), step);
  }
  // `node` stops heartbeating; every other live node goes on; the
  // detector declares it dead.
  void Lose(const std::string& node) {
    for (int i = 0; i < 2; ++i) {
      now_ms_ += 2000;
      for (auto& [id, epoch] : epochs_) {
        if (id != node && Node(id).health() == v1::ALIVE) {
          ASSERT_TRUE(Heartbeat(id, epoch).ok());
        }
      }
    }
    ASSERT_TRUE(coord_->Tick().ok());
    ASSERT_EQ(Node(node).health(), v1::DEAD);
  }
  // A heartbeat does not wait for its batch, and views and orders show
  // durable state only: waits for the group commit's durable changes
  // (WaitForChange, as order_delivery_test does), not for time.
  v1::JobView DurableView(const std::string& node) {
    const uint64_t generation = Job().generation();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    uint64_t seen = 0;
    while (coord_->View("job", node).generation() != generation &&
           std::chrono::steady_clock::now() < deadline)
      seen = coord_->WaitForChange(seen, deadline);
    v1::JobView view = coord_->View("job", node);
    EXPECT_EQ(view.generation(), generation);
    return view;
  }
  std::vector<v1::Order> OrdersOf(const std::string& node, v1::OrderKind kind) {
    std::vector<v1::Order> out;
    auto hb = Heartbeat(node, epochs_[node]);
    EXPECT_TRUE(hb.ok()) << hb.status();
    if (hb.ok())
      for (const v1::Order& o : hb->orders())
        if (o.kind() == kind) out.push_back(o);
    return out;
  }
  static std::vector<uint32_t> Ranks(const v1::Order& o) {
    return {o.ranks().begin(), o.ranks().end()};
  }
  std::vector<std::string> Layout() {
    const v1::JobRecord j = Job();
    return {j.rank_node().begin(), j.rank_node().end()};
  }
  std::vector<uint32_t> RestoreRanks() {
    const v1::JobRecord j = Job();
    return {j.restore_ranks().begin(), j.restore_ranks().end()};
  }

  std::map<std::string, uint64_t> epochs_;
};

TEST_F(ElasticTest, RegisterJobRefusesBadElasticValuesByName) {
  Nodes(2, 2);
  struct Case {
    std::optional<uint32_t> min, multiple;
    const char* field;
  };
  for (const Case& c :
       {Case{0, std::nullopt, "min_world_size"},
        Case{5, std::nullopt, "min_world_size"},
        Case{2, 0, "world_size_multiple"}, Case{3, 2, "min_world_size"}}) {
    auto r = RegisterElastic(4, c.min, c.multiple);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos)
        << r.status();
  }
  // A refusal changes nothing: no job.
  EXPECT_EQ(coord_->GetCluster().jobs_size(), 0);
  auto ok = RegisterElastic(4, 2, 2);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->job().full_world_size(), 4u);
  EXPECT_EQ(ok->job().min_world_size(), 2u);
  EXPECT_EQ(ok->job().world_size_multiple(), 2u);
  // Another launcher of the job must agree.
  auto other = RegisterElastic(4, 4, 2);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(RegisterElastic(4, std::nullopt, std::nullopt).ok());
}

TEST_F(ElasticTest, LostNodeWithoutSpareShrinksRenumberedFromOwnMemory) {
  Nodes(3, 2);
  ASSERT_TRUE(RegisterElastic(6, 2, 2).ok());
  ASSERT_EQ(Layout(),
            (std::vector<std::string>{"n1", "n1", "n2", "n2", "n3", "n3"}));
  CommitStep(5);
  const uint64_t generation = Job().generation();
  Lose("n2");
  const v1::JobRecord job = Job();
  EXPECT_EQ(job.plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(job.generation(), generation + 1);
  EXPECT_EQ(job.world_size(), 4u);
  EXPECT_EQ(job.full_world_size(), 6u);
  EXPECT_TRUE(job.lost_ranks().empty());
  EXPECT_EQ(Layout(), (std::vector<std::string>{"n1", "n1", "n3", "n3"}));
  ASSERT_TRUE(job.has_restore_step());
  EXPECT_EQ(job.restore_step(), 5u);
  // Each new rank restores the saved rank in its own node's memory.
  EXPECT_EQ(job.restore_world_size(), 6u);
  EXPECT_EQ(RestoreRanks(), (std::vector<uint32_t>{0, 1, 4, 5}));
  // The event and the launcher's view say so.
  std::vector<v1::Event> made = EventsOf(v1::PLAN_MADE);
  ASSERT_FALSE(made.empty());
  EXPECT_EQ(made.back().world_size(), 4u);
  EXPECT_NE(made.back().detail().find("2<-4,3<-5"), std::string::npos)
      << made.back().detail();
  v1::JobView view = DurableView("n3");
  EXPECT_EQ(view.world_size(), 4u);
  EXPECT_EQ(std::vector<uint32_t>(view.ranks().begin(), view.ranks().end()),
            (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(view.restore_world_size(), 6u);
  EXPECT_EQ(std::vector<uint32_t>(view.restore_ranks().begin(),
                                  view.restore_ranks().end()),
            (std::vector<uint32_t>{4, 5}));
  // From memory: n3 restarts its new ranks and fetches nothing.
  EXPECT_TRUE(OrdersOf("n3", v1::PREFETCH).empty());
  epochs_.erase("n2");
  std::vector<v1::Order> restart = OrdersOf("n3", v1::RESTART);
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(Ranks(restart[0]), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(restart[0].world_size(), 4u);
  // The new layout saves and commits at its world size.
  CommitStep(6);
  EXPECT_EQ(Job().last_good_world_size(), 4u);
  EXPECT_EQ(Job().world_size(), 4u);  // no node came back: stays shrunk
  // It survives a restart of the coordinator.
  Reopen();
  EXPECT_EQ(Job().world_size(), 4u);
  EXPECT_EQ(Job().full_world_size(), 6u);
}

TEST_F(ElasticTest, ShrinksToAMultipleAndNeverBelowTheLeast) {
  Nodes(2, 3);
  ASSERT_TRUE(RegisterElastic(6, 2, 2).ok());
  CommitStep(3);
  Lose("n2");
  // Three ranks live; the largest multiple of 2 is 2: saved rank 2 is
  // dropped.
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(Layout(), (std::vector<std::string>{"n1", "n1"}));
  EXPECT_EQ(RestoreRanks(), (std::vector<uint32_t>{0, 1}));
  std::vector<v1::Event> made = EventsOf(v1::PLAN_MADE);
  ASSERT_FALSE(made.empty());
  EXPECT_NE(made.back().detail().find("ranks 2 dropped"), std::string::npos)
      << made.back().detail();
}

TEST_F(ElasticTest, BelowTheLeastWorldSizeTheJobWaitsForItsNode) {
  Nodes(2, 2);
  ASSERT_TRUE(RegisterElastic(4, 3, std::nullopt).ok());
  CommitStep(3);
  Lose("n2");
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  EXPECT_EQ(Job().world_size(), 4u);
  std::vector<v1::Event> waiting = EventsOf(v1::PLAN_WAITING);
  ASSERT_FALSE(waiting.empty());
  EXPECT_EQ(waiting.back().world_size(), 4u);
  // Its node comes back: the full job restarts there, as before.
  epochs_["n2"] = Register("n2", 2);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().world_size(), 4u);
  EXPECT_TRUE(Job().restore_ranks().empty());
}

TEST_F(ElasticTest, NotElasticByDefault) {
  Nodes(2, 2);
  RegisterJob("job", 4);
  CommitStep(3);
  Lose("n2");
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  EXPECT_EQ(Job().world_size(), 4u);
}

// A spare too small for the lost node's ranks takes none of them: by
// default the job shrinks at once instead of waiting for a node.
TEST_F(ElasticTest, ASpareTooSmallForTheLostRanksIsNoReasonToWait) {
  Nodes(2, 2);
  epochs_["s1"] = Register("s1", 1, /*spare=*/true);
  ASSERT_TRUE(RegisterElastic(4, 2, std::nullopt).ok());
  CommitStep(3);
  Lose("n2");
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(Layout(), (std::vector<std::string>{"n1", "n1"}));
  EXPECT_TRUE(Node("s1").spare()) << "the spare took nothing";
}

TEST_F(ElasticTest, SpareWaitLetsASpareTakeTheRanksElseShrinksWhenItEnds) {
  spare_wait_ms_ = 10000;
  Reopen();
  Nodes(2, 2);
  ASSERT_TRUE(RegisterElastic(4, 2, std::nullopt).ok());
  CommitStep(3);
  Lose("n2");
  // Within the wait: ranks wait for a spare.
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  epochs_.erase("n2");
  now_ms_ += 3000;
  ASSERT_TRUE(Heartbeat("n1", epochs_["n1"]).ok());
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  // A spare joins in time: it takes them, the job keeps its size.
  epochs_["s1"] = Register("s1", 2, /*spare=*/true);
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().world_size(), 4u);
  EXPECT_EQ(Layout(), (std::vector<std::string>{"n1", "n1", "s1", "s1"}));

  // The spare is lost too, and no other joins: at the wait's end (the
  // failure detector's tick) the job shrinks.
  CommitStep(4);
  Lose("s1");
  epochs_.erase("s1");
  EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE);
  for (int i = 0; i < 4; ++i) {
    now_ms_ += 2000;
    ASSERT_TRUE(Heartbeat("n1", epochs_["n1"]).ok());
    ASSERT_TRUE(coord_->Tick().ok());
    EXPECT_EQ(Job().plan_state(), v1::PLAN_WAITING_FOR_NODE) << i;
  }
  now_ms_ += 2001;
  ASSERT_TRUE(Heartbeat("n1", epochs_["n1"]).ok());
  ASSERT_TRUE(coord_->Tick().ok());
  EXPECT_EQ(Job().plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(Job().world_size(), 2u);
  EXPECT_EQ(Job().restore_step(), 4u);
  EXPECT_EQ(RestoreRanks(), (std::vector<uint32_t>{0, 1}));
}

TEST_F(ElasticTest, GrowsBackAtTheNextCommitOnceItsNodeReturns) {
  Nodes(3, 2);
  ASSERT_TRUE(RegisterElastic(6, 2, 2).ok());
  CommitStep(5);
  Lose("n2");
  ASSERT_EQ(Job().world_size(), 4u);
  const uint64_t shrunk = Job().generation();
  // n2 comes back (a new ckptd, active): nothing restarts now ...
  epochs_["n2"] = Register("n2", 2);
  EXPECT_EQ(Job().generation(), shrunk);
  EXPECT_EQ(Job().world_size(), 4u);
  // ... a step saved at 4 ranks but not yet durable changes nothing ...
  for (uint32_t r = 0; r < 4; ++r) {
    const std::string host = Job().rank_node(r);
    ASSERT_TRUE(Report(host, epochs_[host], 6, r, v1::STAGED).ok());
  }
  EXPECT_EQ(Job().generation(), shrunk);
  // ... its commit is the step boundary: a plan grows the job back to 6,
  // every rank restoring that step, the new ones from a peer's copy.
  for (uint32_t r = 0; r < 4; ++r) {
    const std::string host = Job().rank_node(r);
    ASSERT_TRUE(Report(host, epochs_[host], 6, r, v1::DURABLE).ok());
  }
  const v1::JobRecord job = Job();
  EXPECT_EQ(job.generation(), shrunk + 1);
  EXPECT_EQ(job.plan_state(), v1::PLAN_ORDERED);
  EXPECT_EQ(job.world_size(), 6u);
  EXPECT_EQ(Layout(),
            (std::vector<std::string>{"n1", "n1", "n3", "n3", "n2", "n2"}));
  EXPECT_EQ(job.restore_step(), 6u);
  EXPECT_EQ(job.restore_world_size(), 4u);
  EXPECT_EQ(RestoreRanks(), (std::vector<uint32_t>{0, 1, 2, 3, 0, 1}));
  std::vector<v1::Event> made = EventsOf(v1::PLAN_MADE);
  ASSERT_FALSE(made.empty());
  EXPECT_EQ(made.back().world_size(), 6u);
  EXPECT_NE(made.back().detail().find("grown from world size 4 to 6"),
            std::string::npos)
      << made.back().detail();
  DurableView("n2");
  // n2 fetches saved ranks 0 and 1 of step 6 (a peer's or storage's).
  std::vector<v1::Order> fetch = OrdersOf("n2", v1::PREFETCH);
  ASSERT_EQ(fetch.size(), 1u);
  EXPECT_EQ(Ranks(fetch[0]), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(fetch[0].step(), 6u);
  std::vector<v1::Order> restart = OrdersOf("n2", v1::RESTART);
  ASSERT_EQ(restart.size(), 1u);
  EXPECT_EQ(Ranks(restart[0]), (std::vector<uint32_t>{4, 5}));
  EXPECT_EQ(restart[0].world_size(), 6u);
  // At full size again: the next commit changes no layout.
  const uint64_t grown = Job().generation();
  CommitStep(7);
  EXPECT_EQ(Job().generation(), grown);
  EXPECT_EQ(Job().last_good_world_size(), 6u);
}

}  // namespace
}  // namespace ckpt::coordinator
