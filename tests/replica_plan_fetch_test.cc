// Peer replicas between a real Coordinator (in-process, fake clock) and
// the daemon's parts (ReplicaStore, engines, PrefetchRank): what a holder
// drops reaches the coordinator, so that no plan names a copy the holder
// no longer has; and a PREFETCH names the save the plan chose, so that a
// fetch refuses another save of the same step.
#include <filesystem>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "daemon/agent/node_agent.h"
#include "daemon/agent/peer_fetch.h"
#include "daemon/replica/replica_reports.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "tests/engine_save.h"
#include "tests/replica_fixture.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;

const daemon::PeerCreds kTrainer{getpid(), getuid(), getgid()};

class ReplicaPlanFetchTest : public ReplicaFixture {
 protected:
  void SetUp() override {
    coordinator::CoordinatorOptions o;
    o.state_dir = dir_.path() + "/state";
    o.shared_root = dir_.path() + "/manifests";
    o.heartbeat_timeout = std::chrono::milliseconds(3000);
    o.now_ms = [this] { return now_ms_; };
    auto c = coordinator::Coordinator::Open(o);
    ASSERT_TRUE(c.ok()) << c.status();
    coord_ = std::move(*c);
  }
  void TearDown() override {
    ReplicaFixture::TearDown();
    coord_.reset();
  }

  uint64_t RegisterNode(const std::string& id, uint32_t capacity, bool spare,
                        uint32_t replica_port) {
    cv1::RegisterNodeRequest req;
    req.set_node_id(id);
    req.set_address("127.0.0.1:1");
    req.set_capacity(capacity);
    req.set_spare(spare);
    req.set_domain("rack-" + id);
    req.set_replica_port(replica_port);
    auto r = coord_->RegisterNode(req);
    EXPECT_TRUE(r.ok()) << r.status();
    epochs_[id] = r.ok() ? r->epoch() : 0;
    return epochs_[id];
  }
  void RegisterJob(const std::string& job, uint32_t world_size) {
    cv1::RegisterJobRequest req;
    req.set_job(job);
    req.set_world_size(world_size);
    ASSERT_TRUE(coord_->RegisterJob(req).ok());
  }
  // Sends `node`'s daemon reports as its node agent would (ToReportProto):
  // the first refusal, or OK.
  absl::Status Send(const std::string& node,
                    const std::vector<daemon::ShardReport>& reports) {
    cv1::ReportShardsRequest req;
    req.set_node_id(node);
    req.set_epoch(epochs_[node]);
    for (const daemon::ShardReport& r : reports)
      daemon::ToReportProto(r, req.add_reports());
    auto resp = coord_->ReportShards(req);
    if (!resp.ok()) return resp.status();
    for (const cv1::ReportResult& res : resp->results())
      if (res.code() != 0)
        return absl::Status(static_cast<absl::StatusCode>(res.code()),
                            res.message());
    return absl::OkStatus();
  }
  // Every node but `silent` heartbeats; a timeout later `silent` is dead
  // and its job's plan made.
  void Silence(const std::string& silent) {
    for (int beat = 0; beat < 2; ++beat) {
      for (const auto& [id, epoch] : epochs_)
        if (id != silent) {
          ASSERT_TRUE(coord_->Heartbeat(Beat(id)).ok()) << id;
        }
      now_ms_ += 2000;
    }
    ASSERT_TRUE(coord_->Tick().ok());
  }
  cv1::HeartbeatRequest Beat(const std::string& id) {
    cv1::HeartbeatRequest req;
    req.set_node_id(id);
    req.set_epoch(epochs_[id]);
    return req;
  }
  cv1::Order PrefetchFor(const std::string& node) {
    auto hb = coord_->Heartbeat(Beat(node));
    EXPECT_TRUE(hb.ok()) << hb.status();
    if (hb.ok())
      for (const auto& o : hb->orders())
        if (o.kind() == cv1::PREFETCH) return o;
    ADD_FAILURE() << "no PREFETCH for " << node;
    return {};
  }
  cv1::JobRecord Job(const std::string& job) {
    const cv1::GetClusterResponse cluster = coord_->GetCluster();
    for (const auto& j : cluster.jobs())
      if (j.job() == job) return j;
    ADD_FAILURE() << "no job " << job;
    return {};
  }

  int64_t now_ms_ = 1'000'000;
  std::map<std::string, uint64_t> epochs_;
  std::unique_ptr<coordinator::Coordinator> coord_;
};

// The STAGED report node "a" makes of a shard image (its digest is the
// image's checksums').
daemon::ShardReport StagedOf(const storage::Shard& s) {
  daemon::ShardReport r;
  r.job = s.info.job;
  r.step = s.info.step;
  r.rank = s.info.rank;
  r.bytes = s.image.size();
  r.digest = r.staged_digest = storage::ChecksumsDigest(s.info);
  r.owner_uid = getuid();
  return r;
}

// The holder keeps the two newest copies of each rank, and drops other
// ranks' previous copies to make room for a copy (here rank 1's step 6
// pushes out rank 2's step 5). The sender then dies with step 6 not yet
// replicated for rank 0: step 5 is the newest step with a copy of every
// rank only if rank 2's dropped copy still counted. It does not: the
// holder retracted it, and the plan names no copy the holder lacks.
TEST_F(ReplicaPlanFetchTest, ACopyTheHolderDroppedForRoomIsNeverNamedByAPlan) {
  RegisterNode("a", 3, false, 7101);
  RegisterNode("b", 1, false, 7102);
  RegisterNode("s", 3, true, 7103);
  RegisterJob("job", 3);
  ASSERT_EQ(Job("job").rank_node(2), "a");
  std::vector<daemon::ShardReport> from_holder;  // in the order it made them
  const uint64_t x = ReplicaImage("job", 5, 0, 3).image.size();
  daemon::ReplicaStore holder(
      4 * x + x / 2, [&](const rv1::ShardCopy& dropped) {
        from_holder.push_back(daemon::ReplicaWithdrawalOf(dropped));
      });
  std::vector<daemon::ShardReport> staged;
  auto image = [](uint64_t step, uint32_t rank) {
    return ReplicaImage("job", step, rank, 3, 100000,
                        static_cast<uint32_t>(step * 10 + rank));
  };
  for (uint64_t step : {uint64_t{5}, uint64_t{6}})
    for (uint32_t rank = 0; rank < 3; ++rank)
      staged.push_back(StagedOf(image(step, rank)));
  ASSERT_TRUE(Send("a", staged).ok());
  // Arrivals: every rank's step 5, then rank 2's and rank 1's step 6.
  for (auto [step, rank] : std::vector<std::pair<uint64_t, uint32_t>>{
           {5, 0}, {5, 1}, {5, 2}, {6, 2}, {6, 1}}) {
    const storage::Shard s = image(step, rank);
    auto in = holder.Begin(CopyOf(s, 0, "a"));
    ASSERT_TRUE(in.ok()) << in.status();
    std::memcpy((*in)->data(), s.image.data(), s.image.size());
    auto held = (*in)->Commit();
    ASSERT_TRUE(held.ok()) << held.status();
    from_holder.push_back(daemon::ReplicatedReportOf(**held));
  }
  ASSERT_EQ(holder.Find("job", 5, 2), nullptr) << "dropped for room";
  ASSERT_TRUE(Send("b", from_holder).ok());
  Silence("a");
  const cv1::JobRecord job = Job("job");
  ASSERT_EQ(job.rank_node(0), "s");
  auto hb = coord_->Heartbeat(Beat("s"));
  ASSERT_TRUE(hb.ok()) << hb.status();
  for (const cv1::Order& o : hb->orders()) {
    if (o.kind() != cv1::PREFETCH) continue;
    for (int i = 0; i < o.sources_size(); ++i)
      if (o.sources(i).node_id() == "b") {
        EXPECT_NE(holder.Find("job", o.step(), o.ranks(i)), nullptr)
            << "the plan names rank " << o.ranks(i) << "'s step " << o.step()
            << " on b, which b dropped";
      }
  }
  EXPECT_FALSE(job.has_restore_step() && job.restore_step() == 5u)
      << "step 5 has no copy of rank 2 anywhere";
}

// A PREFETCH from the saving node's own slot (its ranks moved: cordoned)
// names the save the plan chose. The node saves the step again (its
// trainer's last save before it stops) before the spare fetches: the
// fetch refuses that other save and falls to the stored copy of the one
// chosen.
TEST_F(ReplicaPlanFetchTest, AFetchRefusesAnotherSaveOfTheStepThePlanChose) {
  Node& a = OpenNode("a", dir_.path() + "/a-root");
  Node& s = OpenNode("s", dir_.path() + "/shared");
  std::mutex mu;
  std::vector<daemon::ShardReport> reports;
  a.on_report = [&](const daemon::ShardReport& r) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(r);
  };
  StartHolder(1 << 20, {}, a.engine.get());  // a's replica listener
  RegisterNode("a", 1, false, static_cast<uint32_t>(server_->port()));
  RegisterNode("s", 1, true, 7103);
  RegisterJob("core", 1);
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kTrainer, {"core", 4}, &arena).ok());
  ASSERT_TRUE(a.engine->WaitIdle(std::chrono::seconds(20)));
  auto chosen = a.engine->SnapshotStaged("core", 4, 0);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  const std::vector<char> want(chosen->data(),
                               chosen->data() + chosen->copy.image_bytes());
  // Its stored copy, where the spare reads the shared root.
  const std::string key = storage::ShardKey("core", 4, 0, "a");
  std::filesystem::create_directories(
      std::filesystem::path(dir_.path() + "/shared/" + key).parent_path());
  std::filesystem::copy_file(dir_.path() + "/a-root/" + key,
                             dir_.path() + "/shared/" + key);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(Send("a", reports).ok());
    reports.clear();
  }
  cv1::CordonRequest cordon;
  cordon.set_node_id("a");
  cordon.set_reason("ECC errors");
  ASSERT_TRUE(coord_->Cordon(cordon).ok());
  ASSERT_EQ(Job("core").rank_node(0), "s");
  const cv1::Order prefetch = PrefetchFor("s");
  ASSERT_EQ(prefetch.step(), 4u);
  ASSERT_EQ(prefetch.sources_size(), 1);
  ASSERT_EQ(prefetch.sources(0).node_id(), "a");
  ASSERT_FALSE(prefetch.sources(0).replica());
  ASSERT_EQ(prefetch.shard_keys(0), key);
  // The stopping trainer saves step 4 again, other bytes.
  OneTensorSave again{"core", 4};
  again.fill = 0x5a;
  ASSERT_TRUE(SaveOneTensorStep(a.engine.get(), kTrainer, again, &arena).ok());
  std::vector<daemon::FallbackReport> fallbacks;
  ASSERT_TRUE(daemon::PrefetchRank(
                  *s.engine, {}, "core", 1, 4, 0, prefetch.shard_keys(0),
                  &prefetch.sources(0), getuid(),
                  [&](daemon::FallbackReport f) { fallbacks.push_back(f); })
                  .ok());
  auto restored = Restore(s, "core", 4, 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == want) << "the spare restored another save";
  ASSERT_EQ(fallbacks.size(), 1u);
  EXPECT_EQ(fallbacks[0].next_copy, "file");
  EXPECT_NE(fallbacks[0].reason.find("digest"), std::string::npos)
      << fallbacks[0].reason;
  // a's persist of the second save reports into `reports` under `mu`:
  // both must outlive it.
  ASSERT_TRUE(a.engine->WaitIdle(std::chrono::seconds(20)));
}

// A PREFETCH names a second holder of the chosen save for a rank (in
// another failure domain than the first): a fetch that finds no copy at
// the first (it dropped it, and its withdrawal had not reached the
// coordinator when the plan was made) takes the second's, in the same
// plan, where no stored copy exists to fall back to.
TEST_F(ReplicaPlanFetchTest,
       AFetchThatFindsNoCopyAtTheFirstHolderTakesTheSecond) {
  Node& s = OpenNode("s", dir_.path() + "/shared");
  StartHolder(1ull << 30);  // holder "b"
  daemon::ReplicaStore c_store(1ull << 30);
  daemon::ReplicaServerOptions so;
  so.host = "127.0.0.1";
  auto c_server = daemon::ReplicaServer::Start(so, &c_store, nullptr);
  ASSERT_TRUE(c_server.ok()) << c_server.status();
  RegisterNode("a", 1, false, 7101);
  RegisterNode("b", 1, false, static_cast<uint32_t>(server_->port()));
  RegisterNode("c", 1, false, static_cast<uint32_t>((*c_server)->port()));
  RegisterNode("s", 1, true, 7104);
  RegisterJob("core", 1);
  ASSERT_EQ(Job("core").rank_node(0), "a");
  auto image = [](uint64_t step) {
    return ReplicaImage("core", step, 0, 1, 100000,
                        static_cast<uint32_t>(step));
  };
  const storage::Shard s4 = image(4);
  ASSERT_TRUE(Send("a", {StagedOf(s4)}).ok());
  // Both holders keep a's step 4 and say so.
  ASSERT_TRUE(Put(CopyOf(s4, 0, "a"), s4.image).ok());
  auto c_channel = daemon::ReplicaChannel(
      {}, "c", "127.0.0.1", static_cast<uint32_t>((*c_server)->port()));
  ASSERT_TRUE(c_channel.ok()) << c_channel.status();
  ASSERT_TRUE(Put(CopyOf(s4, 0, "a"), s4.image, c_channel->get()).ok());
  ASSERT_TRUE(
      Send("b", {daemon::ReplicatedReportOf(*store_->Find("core", 4, 0))})
          .ok());
  ASSERT_TRUE(
      Send("c", {daemon::ReplicatedReportOf(*c_store.Find("core", 4, 0))})
          .ok());
  // b then takes a's steps 5 and 6 (never staged: a dies first) and drops
  // step 4; its withdrawal is still on the way when a dies.
  for (uint64_t step : {5, 6}) {
    const storage::Shard later = image(step);
    ASSERT_TRUE(Put(CopyOf(later, 0, "a"), later.image).ok());
  }
  ASSERT_EQ(store_->Find("core", 4, 0), nullptr);
  Silence("a");
  ASSERT_EQ(Job("core").rank_node(0), "s");
  const cv1::Order prefetch = PrefetchFor("s");
  ASSERT_EQ(prefetch.step(), 4u);
  ASSERT_EQ(prefetch.sources_size(), 1);
  ASSERT_EQ(prefetch.sources(0).node_id(), "b");
  ASSERT_EQ(prefetch.shard_keys(0), "") << "no stored copy to fall back to";
  std::vector<daemon::FallbackReport> fallbacks;
  absl::Status fetched = daemon::PrefetchRank(
      *s.engine, {}, "core", 1, 4, 0, prefetch.shard_keys(0),
      &prefetch.sources(0), getuid(),
      [&](daemon::FallbackReport f) { fallbacks.push_back(f); });
  ASSERT_TRUE(fetched.ok()) << "the fetch failed with a second holder of "
                               "the copy alive: "
                            << fetched;
  auto restored = Restore(s, "core", 4, 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == s4.image);
  ASSERT_EQ(fallbacks.size(), 1u);
  EXPECT_NE(fallbacks[0].reason.find("on b"), std::string::npos)
      << fallbacks[0].reason;
  EXPECT_EQ(fallbacks[0].next_copy, "memory");
}

// ShardSources (a restore reading saved ranks this node lacks): per rank
// the owner's slot while its node serves, with the save's digest; none
// once that node is dead and no replica is known; each bad field refused
// by name.
TEST_F(ReplicaPlanFetchTest, ShardSourcesNamesTheOwnersSlotAndRefusesBadInput) {
  RegisterNode("a", 1, false, 7101);
  RegisterNode("b", 1, false, 7102);
  RegisterNode("c", 1, true, 7103);
  RegisterJob("job", 2);
  const std::string owner0 = Job("job").rank_node(0);
  const std::string owner1 = Job("job").rank_node(1);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const std::string& owner = rank == 0 ? owner0 : owner1;
    ASSERT_TRUE(Send(owner, {StagedOf(ReplicaImage("job", 5, rank, 2))}).ok());
  }
  cv1::ShardSourcesRequest req;
  req.set_node_id("c");
  req.set_epoch(epochs_["c"]);
  req.set_job("job");
  req.set_step(5);
  req.add_ranks(1);
  req.add_ranks(0);
  auto resp = coord_->ShardSources(req);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->world_size(), 2u);
  ASSERT_EQ(resp->ranks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const cv1::RankShardSource& r = resp->ranks(i);
    EXPECT_EQ(r.rank(), i == 0 ? 1u : 0u);
    EXPECT_EQ(r.source().node_id(), r.rank() == 0 ? owner0 : owner1);
    EXPECT_EQ(r.source().host(), "127.0.0.1");
    EXPECT_FALSE(r.source().replica());
    ASSERT_EQ(r.source().save_digests_size(), 1);
    EXPECT_EQ(
        r.source().save_digests(0),
        storage::ChecksumsDigest(ReplicaImage("job", 5, r.rank(), 2).info));
  }
  // Refusals name the field.
  auto refused = [&](cv1::ShardSourcesRequest bad, const std::string& what) {
    auto r = coord_->ShardSources(bad);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(what), std::string::npos)
          << r.status();
    }
  };
  cv1::ShardSourcesRequest bad = req;
  bad.set_job("no/such job");
  refused(bad, "job");
  bad = req;
  bad.add_ranks(2);
  refused(bad, "ranks[2]: 2 is not below world_size 2");
  bad = req;
  bad.set_step(6);
  refused(bad, "step: job 'job' has no shard of step 6");
  bad = req;
  bad.set_epoch(epochs_["c"] + 1);
  refused(bad, "epoch");
  bad = req;
  for (int i = 0; i <= coordinator::Coordinator::kMaxSourceRanks; ++i)
    bad.add_ranks(0);
  refused(bad, "ranks: ");
  // The owner of rank 0 dies (no replica of it is known): it is never
  // named (the plan that follows may also drop the step's records).
  Silence(owner0);
  req.set_epoch(epochs_["c"]);
  resp = coord_->ShardSources(req);
  if (resp.ok()) {
    EXPECT_TRUE(resp->ranks(1).source().host().empty());
  } else {
    EXPECT_EQ(resp.status().code(), absl::StatusCode::kNotFound)
        << resp.status();
  }
}

}  // namespace
}  // namespace ckpt::testing
