// MANIFEST.global, the commit point of a step, is written
// to the shared root, which no leader fence can guard. Two coordinators in
// one process stand for an HA pair: their state is one in-memory store
// fenced like EtcdKv (a write of a leader that is no longer the current one
// is refused, changing nothing), and the old leader's manifest write is
// held at a gate while the new leader takes over, replans and commits the
// same step; then the gate opens and the deposed leader's write lands.
#include <thread>

#include "coordinator/coordinator_testing.h"
#include "tests/gated_backend.h"

namespace ckpt::coordinator {
namespace {

// The keys and values every leader shares, and who leads.
struct SharedState {
  std::mutex mu;
  std::map<std::string, std::string> kv;
  uint64_t leader = 0;
};

// KvBackend over SharedState for the leader holding `fence` (EtcdKv's
// contract: every write is conditional on still leading).
class FencedKv : public KvBackend {
 public:
  FencedKv(std::shared_ptr<SharedState> state, uint64_t fence)
      : state_(std::move(state)), fence_(fence) {}
  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    std::lock_guard<std::mutex> l(state_->mu);
    auto it = state_->kv.find(key);
    if (it == state_->kv.end()) return std::nullopt;
    return it->second;
  }
  absl::Status Scan(
      const std::string& prefix,
      const std::function<absl::Status(const std::string&, const std::string&)>&
          visit) override {
    std::map<std::string, std::string> copy;
    {
      std::lock_guard<std::mutex> l(state_->mu);
      copy = state_->kv;
    }
    for (auto it = copy.lower_bound(prefix);
         it != copy.end() && it->first.rfind(prefix, 0) == 0; ++it)
      if (absl::Status s = visit(it->first, it->second); !s.ok()) return s;
    return absl::OkStatus();
  }
  absl::Status Write(const KvBatch& batch) override {
    return WriteGroup({&batch});
  }
  absl::Status WriteGroup(const std::vector<const KvBatch*>& batches) override {
    std::lock_guard<std::mutex> l(state_->mu);
    if (state_->leader != fence_)
      return absl::UnavailableError("not leader: fence " +
                                    std::to_string(fence_) + " is deposed");
    for (const KvBatch* b : batches)
      for (const KvOp& op : *b) {
        if (op.is_delete)
          state_->kv.erase(op.key);
        else
          state_->kv[op.key] = op.value;
      }
    return absl::OkStatus();
  }
  std::string Describe() const override { return "fenced memory"; }

 private:
  const std::shared_ptr<SharedState> state_;
  const uint64_t fence_;
};

class FencedLeadersTest : public TwoNodeTest {
 protected:
  // A coordinator leading with `fence` on the shared state; `gate` (when
  // set) is given the gated shared root.
  std::unique_ptr<Coordinator> Leader(uint64_t fence,
                                      OwningGate** gate = nullptr) {
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->leader = fence;
    }
    CoordinatorOptions o;
    o.shared_root = dir_.path() + "/shared";
    o.heartbeat_timeout = std::chrono::milliseconds(3000);
    o.shared_root_wait = std::chrono::milliseconds(0);
    o.now_ms = [this] { return now_ms_; };
    o.fence = fence;
    if (gate)
      o.wrap_shared_root = [gate](std::unique_ptr<storage::Backend> b) {
        auto g = std::make_unique<OwningGate>(std::move(b));
        *gate = g.get();
        return std::unique_ptr<storage::Backend>(std::move(g));
      };
    auto c = Coordinator::Open(o, std::make_unique<FencedKv>(state_, fence));
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    (*c)->StartServing();
    return std::move(*c);
  }
  static absl::Status Report(Coordinator& c, const std::string& node,
                             uint64_t epoch, uint64_t step, uint32_t rank,
                             v1::ShardState state, uint64_t generation) {
    v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    req.set_job("job");
    req.set_step(step);
    req.set_rank(rank);
    req.set_state(state);
    req.set_bytes(1000 + rank);
    req.set_checksum_digest(0xabc0 + rank + 0x100 * generation);
    req.set_generation(generation);
    if (state == v1::DURABLE)
      req.set_key(storage::ShardKey("job", step, rank, node));
    return c.ReportShard(req).status();
  }
  static v1::JobRecord JobOf(Coordinator& c) {
    const v1::GetClusterResponse cluster = c.GetCluster();
    for (const auto& j : cluster.jobs())
      if (j.job() == "job") return j;
    return {};
  }

  // Leader A (fence 1) has every rank of step 10 durable but its manifest
  // write is held; it is deposed, B (fence 2) leads, n2 goes silent, the
  // plan moves ranks 2 and 3 to the spare, and B commits the new
  // timeline's step 10. Then A's write lands. Returns B.
  std::unique_ptr<Coordinator> DeposedLeaderWritesLate() {
    OwningGate* gate = nullptr;
    std::unique_ptr<Coordinator> a = Leader(1, &gate);
    if (!a) return nullptr;
    v1::RegisterNodeRequest reg;
    reg.set_capacity(2);
    for (const char* id : {"n1", "n2", "s1"}) {
      reg.set_node_id(id);
      reg.set_address(std::string(id) + ":1");
      reg.set_spare(std::string(id) == "s1");
      auto r = a->RegisterNode(reg);
      EXPECT_TRUE(r.ok()) << r.status();
      epochs_[id] = r.ok() ? r->epoch() : 0;
    }
    v1::RegisterJobRequest job;
    job.set_job("job");
    job.set_world_size(4);
    EXPECT_TRUE(a->RegisterJob(job).ok());
    for (uint32_t r = 0; r < 4; ++r) {
      const char* node = r < 2 ? "n1" : "n2";
      EXPECT_TRUE(Report(*a, node, epochs_[node], 10, r, v1::STAGED, 0).ok());
      if (r < 3) {
        EXPECT_TRUE(
            Report(*a, node, epochs_[node], 10, r, v1::DURABLE, 0).ok());
      }
    }
    gate->Close("MANIFEST.global");
    absl::Status a_last;
    std::thread a_commit([&] {
      a_last = Report(*a, "n2", epochs_["n2"], 10, 3, v1::DURABLE, 0);
    });
    while (gate->waiting() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));

    // A stops (SIGSTOP, a VM freeze) with its write in flight; B leads.
    std::unique_ptr<Coordinator> b = Leader(2);
    if (!b) {
      gate->Open();
      a_commit.join();
      return nullptr;
    }
    now_ms_ += 2000;
    EXPECT_TRUE(b->Heartbeat(Hb("n1")).ok());
    EXPECT_TRUE(b->Heartbeat(Hb("s1")).ok());
    now_ms_ += 2000;  // n2 silent: dead, ranks 2 and 3 go to s1
    EXPECT_TRUE(b->Tick().ok());
    v1::JobRecord moved = JobOf(*b);
    EXPECT_EQ(moved.rank_node(3), "s1");
    const uint64_t gen = moved.generation();
    for (uint32_t r = 0; r < 4; ++r) {
      const char* node = r < 2 ? "n1" : "s1";
      EXPECT_TRUE(Report(*b, node, epochs_[node], 10, r, v1::STAGED, gen).ok());
      EXPECT_TRUE(
          Report(*b, node, epochs_[node], 10, r, v1::DURABLE, gen).ok());
    }
    EXPECT_EQ(JobOf(*b).last_good_step(), 10u);

    // A resumes: its write lands; its commit (a fenced write) cannot.
    gate->Open();
    a_commit.join();
    EXPECT_FALSE(a_last.ok()) << "the deposed leader committed";
    return b;
  }
  v1::HeartbeatRequest Hb(const std::string& node) {
    v1::HeartbeatRequest hb;
    hb.set_node_id(node);
    hb.set_epoch(epochs_[node]);
    return hb;
  }

  std::shared_ptr<SharedState> state_ = std::make_shared<SharedState>();
  std::map<std::string, uint64_t> epochs_;
};

TEST_F(FencedLeadersTest,
       DeposedLeadersLateManifestNeverStandsForTheCommittedStep) {
  std::unique_ptr<Coordinator> b = DeposedLeaderWritesLate();
  ASSERT_TRUE(b);
  // The new leader finds the late write and puts its committed one back.
  ASSERT_TRUE(b->AuditManifests().ok());
  auto m = ReadManifest(10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->fence(), 2u);
  EXPECT_EQ(m->generation(), JobOf(*b).generation());
  EXPECT_EQ(m->shards(2).node_id(), "s1")
      << "rank 2's shard is the old timeline's, on the dead node";
  EXPECT_EQ(m->shards(3).key(), storage::ShardKey("job", 10, 3, "s1"));
  // A leader after B trusts it, and restores from the spare's keys.
  b.reset();
  std::unique_ptr<Coordinator> c = Leader(3);
  ASSERT_TRUE(c);
  EXPECT_EQ(JobOf(*c).last_good_step(), 10u);
}

// The same, with no audit before the next leader: the manifest at the key is
// the deposed leader's. The next leader checks it against the commit, does
// not trust it, and does not forget the step either: the commit kept the
// manifest it refers to, which goes back to the shared root (event
// MANIFEST_INVALID naming the fences).
TEST_F(FencedLeadersTest, NextLeaderPutsTheCommittedManifestBackOverALateOne) {
  std::unique_ptr<Coordinator> b = DeposedLeaderWritesLate();
  ASSERT_TRUE(b);
  const uint64_t gen = JobOf(*b).generation();
  b.reset();
  std::unique_ptr<Coordinator> c = Leader(3);
  ASSERT_TRUE(c);
  v1::JobRecord j = JobOf(*c);
  EXPECT_TRUE(j.has_last_good());
  EXPECT_EQ(j.last_good_step(), 10u)
      << "a deposed leader's late write erased the good step 10";
  auto m = ReadManifest(10);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->fence(), 2u);
  EXPECT_EQ(m->generation(), gen);
  EXPECT_EQ(m->shards(3).key(), storage::ShardKey("job", 10, 3, "s1"));
  bool named = false;
  const v1::EventsResponse events = c->Events({});
  for (const auto& e : events.events())
    named |= e.kind() == v1::MANIFEST_INVALID &&
             e.detail().find("fence 1") != std::string::npos;
  EXPECT_TRUE(named);
}

// When the committed manifest is not kept (a step committed by an older
// coordinator) and the one at the key is another write with other shards,
// nothing can rebuild it: the next leader refuses to start, naming the
// manifest, and the good step stays in the state.
TEST_F(FencedLeadersTest, NextLeaderWithoutTheCommittedManifestRefusesToStart) {
  std::unique_ptr<Coordinator> b = DeposedLeaderWritesLate();
  ASSERT_TRUE(b);
  b.reset();
  {
    std::lock_guard<std::mutex> l(state_->mu);
    for (auto it = state_->kv.begin(); it != state_->kv.end();)
      it = it->first.rfind("G/", 0) == 0 ? state_->kv.erase(it) : std::next(it);
    state_->leader = 3;
  }
  CoordinatorOptions o;
  o.shared_root = dir_.path() + "/shared";
  o.heartbeat_timeout = std::chrono::milliseconds(3000);
  o.shared_root_wait = std::chrono::milliseconds(0);
  o.now_ms = [this] { return now_ms_; };
  o.fence = 3;
  auto c = Coordinator::Open(o, std::make_unique<FencedKv>(state_, 3));
  ASSERT_FALSE(c.ok()) << "started without a good step's manifest";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
      << c.status();
  EXPECT_NE(c.status().message().find(ManifestPath(10)), std::string::npos)
      << c.status();
  v1::JobRecord j;
  {
    std::lock_guard<std::mutex> l(state_->mu);
    ASSERT_TRUE(j.ParseFromString(state_->kv.at("J/job")));
  }
  EXPECT_TRUE(j.has_last_good());
  EXPECT_EQ(j.last_good_step(), 10u);
}

}  // namespace
}  // namespace ckpt::coordinator
