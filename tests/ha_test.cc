// High availability on etcd, with real processes: a three-member etcd
// cluster on loopback (tests/etcd_harness.h), ckpt-coordinator replicas on
// --state etcd://..., and the multi-node cluster of tests/cluster_harness.h
// with trainers running. Leaders are SIGKILLed and SIGSTOPped, etcd members
// killed; every scenario checks that state written by a leader survives and
// that nothing a deposed leader tries lands.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "tests/ha_fixture.h"

namespace ckpt::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TEST_F(
    HaTest,
    LeaderKilledDuringJobStandbyLeadsWithinTimeoutLosingNoStepAndMakingNoSecondPlan) {
  ClusterOptions o = Options(2);
  o.world_size = 2;
  o.nproc_per_node = 1;
  o.last_step = 90;
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  const int old_leader = cluster_->LeaderReplica();
  ASSERT_GE(old_leader, 0);
  cluster_->StartNode("a");
  cluster_->StartNode("b");
  ASSERT_TRUE(Cluster::WaitUntil([&] { return LastGood() >= 3; }, seconds(60)))
      << "no step became durable";

  // One failure: a trainer dies; the leader plans; then the leader dies.
  pid_t victim = cluster_->TrainerPid(1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] { return CountEvents(cv1::PLAN_MADE) >= 1; }, seconds(20)));
  const uint64_t good_before = LastGood();
  const uint32_t generation = cluster_->Job()->generation();
  const auto killed_at = std::chrono::steady_clock::now();
  cluster_->SignalReplica(old_leader, SIGKILL);
  ASSERT_TRUE(cluster_->WaitReplica(old_leader, seconds(5)).has_value());

  int new_leader = -1;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] { return (new_leader = cluster_->LeaderReplica()) >= 0; },
      seconds(30)));
  const double takeover_s = std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - killed_at)
                                .count();
  std::fprintf(
      stderr,
      "takeover after leader SIGKILL: %.2f s (heartbeat timeout %d ms)\n",
      takeover_s, o.heartbeat_timeout_ms);
  EXPECT_NE(new_leader, old_leader);
  // The lease (2 s) runs out, then the standby campaigns and loads the
  // state: seconds, more on a loaded machine; the bound only catches a
  // standby that never notices.
  EXPECT_LE(takeover_s, o.heartbeat_timeout_ms / 1000.0 + 20.0);
  // good_before came from the old leader's memory, which may run ahead of
  // its last durable write: the nodes send those reports again to the new
  // leader, so the step comes back.
  EXPECT_TRUE(Cluster::WaitUntil([&] { return LastGood() >= good_before; },
                                 seconds(30)))
      << "a committed step was lost in the failover: last good " << LastGood()
      << " < " << good_before;

  // Training goes on under the new leader, to the last step.
  for (const char* id : {"a", "b"}) {
    auto st = cluster_->WaitLauncher(id, seconds(120));
    ASSERT_TRUE(st.has_value()) << "ckptrun of node " << id << " still running";
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
        << "ckptrun of node " << id << " wait status " << *st;
  }
  for (uint32_t r = 0; r < o.world_size; ++r) {
    bool done = false;
    for (const auto& l : cluster_->TrainerLog(r)) {
      EXPECT_NE(l.kind, "mismatch") << "rank " << r;
      done = done || l.kind == "done";
    }
    EXPECT_TRUE(done) << "rank " << r << " did not finish";
  }
  EXPECT_EQ(CountEvents(cv1::PLAN_MADE), 1) << "one failure, one plan";
  EXPECT_EQ(cluster_->Job()->generation(), generation)
      << "the new leader re-planned";
  EXPECT_GT(LastGood(), good_before);
}

TEST_F(HaTest, LeaderReconnectsToAnotherEtcdMemberWhenItsMemberDies) {
  ClusterOptions o = Options(1);
  o.coordinator_args = {"--lease-ttl-s",
                        "5"};  // outlasts etcd's own leader election
  cluster_ = std::make_unique<Cluster>(o);
  cluster_->StartCoordinator();
  ASSERT_EQ(cluster_->LeaderReplica(), 0);
  auto client = Client();
  cv1::RegisterNodeRequest reg;
  reg.set_node_id("n1");
  reg.set_address("127.0.0.1");
  reg.set_capacity(1);
  cv1::RegisterNodeResponse resp;
  ASSERT_TRUE(
      client
          ->Call(&cv1::Coordinator::Stub::RegisterNode, reg, &resp, seconds(5))
          .ok());

  etcd_->Kill(
      0);  // the first endpoint of --state: the member the leader talks to
  reg.set_node_id("n2");
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        return client
            ->Call(&cv1::Coordinator::Stub::RegisterNode, reg, &resp,
                   seconds(5))
            .ok();
      },
      seconds(20)))
      << "no write succeeded after the etcd member died";
  std::this_thread::sleep_for(
      seconds(6));  // more than a lease: keepalives go to the new member too
  EXPECT_FALSE(cluster_->WaitReplica(0, milliseconds(0)).has_value())
      << "the leader exited";
  EXPECT_EQ(cluster_->LeaderReplica(), 0);
  std::string log = ReplicaLog(0);
  EXPECT_NE(log.find("unreachable; now talking to"), std::string::npos) << log;
  auto c = cluster_->GetCluster();
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->nodes_size(), 2);
}

TEST_F(HaTest, DeposedLeaderResumedAfterStopPastItsLeaseIsRefusedEveryWrite) {
  ClusterOptions o = Options(2);
  cluster_ =
      std::make_unique<Cluster>(o);  // heartbeat timeout 2 s: a 2 s lease
  cluster_->StartCoordinator();
  const int old_leader = cluster_->LeaderReplica();
  ASSERT_GE(old_leader, 0);
  auto client = Client();
  cv1::RegisterNodeRequest reg;
  reg.set_node_id("n1");
  reg.set_address("127.0.0.1");
  reg.set_capacity(1);
  cv1::RegisterNodeResponse registered;
  ASSERT_TRUE(client
                  ->Call(&cv1::Coordinator::Stub::RegisterNode, reg,
                         &registered, seconds(5))
                  .ok());
  auto heartbeat = [&] {
    cv1::HeartbeatRequest hb;
    hb.set_node_id("n1");
    hb.set_epoch(registered.epoch());
    cv1::HeartbeatResponse r;
    return client->Call(&cv1::Coordinator::Stub::Heartbeat, hb, &r, seconds(1))
        .ok();
  };

  cluster_->SignalReplica(old_leader, SIGSTOP);
  int new_leader = -1;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        (void)heartbeat();  // n1 stays alive under whoever leads
        new_leader = cluster_->LeaderReplica();
        return new_leader >= 0 && new_leader != old_leader;
      },
      seconds(30)));
  for (int i = 0; i < 10;
       ++i) {  // the stopped leader's view of n1 is now stale
    ASSERT_TRUE(heartbeat());
    std::this_thread::sleep_for(milliseconds(300));
  }

  cluster_->SignalReplica(old_leader, SIGCONT);
  // Its own timers fire at once (n1's heartbeat looks 5 s old to it), and a
  // client writes to it directly: nothing may land.
  cv1::RegisterNodeRequest intruder = reg;
  intruder.set_node_id("intruder");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(3));
  cv1::RegisterNodeResponse ignored;
  grpc::Status s =
      cluster_->Stub(old_leader)->RegisterNode(&ctx, intruder, &ignored);
  EXPECT_FALSE(s.ok()) << "the deposed leader accepted a write";
  std::fprintf(stderr, "deposed leader answered: %d %s\n", s.error_code(),
               s.error_message().c_str());
  auto st = cluster_->WaitReplica(old_leader, seconds(10));
  ASSERT_TRUE(st.has_value()) << "the deposed leader kept running";
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 3) << "wait status " << *st;
  EXPECT_NE(ReplicaLog(old_leader).find("lost leadership"), std::string::npos)
      << ReplicaLog(old_leader);

  ASSERT_TRUE(heartbeat());
  auto c = cluster_->GetCluster();
  ASSERT_TRUE(c.has_value());
  ASSERT_EQ(c->nodes_size(), 1) << "the intruder's registration landed";
  EXPECT_EQ(c->nodes(0).health(), cv1::ALIVE) << c->nodes(0).dead_reason();
  EXPECT_EQ(c->nodes(0).epoch(), registered.epoch());
  for (const auto& e : cluster_->Events())
    EXPECT_NE(e.kind(), cv1::FAILURE_DETECTED) << e.detail();
}

// A deposed leader's late manifest write, with real processes: the old
// leader A is held in the
// middle of its MANIFEST.global write of step 10 (a test-only fault of the
// binary). A is deposed while it runs (its election key deleted in etcd: A
// does not know yet, as after a partition or a pause its clock did not
// see; a SIGSTOP would let A's own lease check exit it before its held
// write lands). The new leader B replans (n2 silent: ranks 2 and 3 move to
// the spare) and commits the new timeline's step 10. Then A's write lands
// over B's, A's commit is refused by the fence, and A exits. The committed
// manifest must be B's: B finds the late write and puts its own back.
TEST_F(HaTest,
       DeposedLeadersLateManifestWriteNeverReplacesTheNewLeadersCommit) {
  const std::string hold = dir_.path() + "/hold-manifest";
  ASSERT_EQ(setenv("CKPT_COORDINATOR_TEST_FAULT",
                   ("hold-global-manifest:" + hold).c_str(), 1),
            0);
  cluster_ = std::make_unique<Cluster>(Options(2));
  cluster_->StartCoordinator();
  unsetenv("CKPT_COORDINATOR_TEST_FAULT");
  const int a = cluster_->LeaderReplica();
  ASSERT_GE(a, 0);
  const int b = 1 - a;
  auto stub_a = cluster_->Stub(a), stub_b = cluster_->Stub(b);
  auto call = [](auto method, auto* stub, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    return (stub->*method)(&ctx, req, resp);
  };
  std::map<std::string, uint64_t> epochs;
  for (const char* id : {"n1", "n2", "s1"}) {
    cv1::RegisterNodeRequest reg;
    reg.set_node_id(id);
    reg.set_address(std::string(id) + ":1");
    reg.set_capacity(2);
    reg.set_spare(std::string(id) == "s1");
    cv1::RegisterNodeResponse r;
    grpc::Status s =
        call(&cv1::Coordinator::Stub::RegisterNode, stub_a.get(), reg, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
    epochs[id] = r.epoch();
  }
  // Heartbeats: every node to A (it must not write anything else: no
  // timeouts there), and n1 and s1 to B once it leads (n2 goes silent).
  std::atomic<bool> stop{false};
  std::thread beats([&] {
    auto to_a = cluster_->Stub(a), to_b = cluster_->Stub(b);
    while (!stop) {
      for (const char* id : {"n1", "n2", "s1"}) {
        cv1::HeartbeatRequest hb;
        hb.set_node_id(id);
        hb.set_epoch(epochs[id]);
        cv1::HeartbeatResponse r;
        (void)call(&cv1::Coordinator::Stub::Heartbeat, to_a.get(), hb, &r);
        if (std::string(id) != "n2")
          (void)call(&cv1::Coordinator::Stub::Heartbeat, to_b.get(), hb, &r);
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  struct StopBeats {
    std::atomic<bool>& stop;
    std::thread& t;
    ~StopBeats() {
      stop = true;
      t.join();
    }
  } stop_beats{stop, beats};
  cv1::RegisterJobRequest job;
  job.set_job("job");
  job.set_world_size(4);
  cv1::RegisterJobResponse job_resp;
  ASSERT_TRUE(
      call(&cv1::Coordinator::Stub::RegisterJob, stub_a.get(), job, &job_resp)
          .ok());
  auto report = [&](cv1::Coordinator::Stub* stub, const std::string& node,
                    uint32_t rank, cv1::ShardState state, uint64_t generation) {
    cv1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_epoch(epochs[node]);
    req.set_job("job");
    req.set_step(10);
    req.set_rank(rank);
    req.set_state(state);
    req.set_bytes(4096);
    req.set_checksum_digest(0xabc0 + rank + 0x100 * generation);
    req.set_generation(generation);
    if (state == cv1::DURABLE)
      req.set_key(storage::ShardKey("job", 10, rank, node));
    cv1::ReportShardResponse r;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(60));
    return stub->ReportShard(&ctx, req, &r);
  };
  for (uint32_t r = 0; r < 4; ++r) {
    const char* node = r < 2 ? "n1" : "n2";
    ASSERT_TRUE(report(stub_a.get(), node, r, cv1::STAGED, 0).ok());
    if (r < 3) {
      ASSERT_TRUE(report(stub_a.get(), node, r, cv1::DURABLE, 0).ok());
    }
  }
  { std::ofstream(hold) << "held\n"; }
  grpc::Status late;
  std::thread late_commit(
      [&] { late = report(stub_a.get(), "n2", 3, cv1::DURABLE, 0); });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join_late{late_commit};
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] { return access((hold + ".taken").c_str(), F_OK) == 0; },
      seconds(30)))
      << "A never started its manifest write";

  // Depose A behind its back: its election key goes; B creates it anew.
  auto state = coordinator::etcd::ParseEtcdState(etcd_->StateUrl("ckpt-test"),
                                                 "--state");
  ASSERT_TRUE(state.ok()) << state.status();
  etcdserverpb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key(state->prefix +
                                                             "leader");
  ASSERT_TRUE(EtcdClientOf(0, 1)->Txn(txn).ok());
  cv1::GetClusterResponse view;
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        return call(&cv1::Coordinator::Stub::GetCluster, stub_b.get(),
                    cv1::GetClusterRequest(), &view)
                   .ok() &&
               view.jobs_size() == 1 && view.jobs(0).rank_node(3) == "s1";
      },
      seconds(30)))
      << "B never led, or never moved n2's ranks";
  const uint64_t generation = view.jobs(0).generation();
  for (uint32_t r = 0; r < 4; ++r) {
    const char* node = r < 2 ? "n1" : "s1";
    ASSERT_TRUE(report(stub_b.get(), node, r, cv1::STAGED, generation).ok());
    ASSERT_TRUE(report(stub_b.get(), node, r, cv1::DURABLE, generation).ok());
  }
  ASSERT_TRUE(call(&cv1::Coordinator::Stub::GetCluster, stub_b.get(),
                   cv1::GetClusterRequest(), &view)
                  .ok());
  ASSERT_EQ(view.jobs(0).last_good_step(), 10u);
  ASSERT_EQ(view.jobs(0).manifest_stamps().count(10), 1u);
  const uint64_t b_fence = view.jobs(0).manifest_stamps().at(10).fence();

  // A's write lands now; its commit cannot, and it exits.
  ASSERT_EQ(unlink(hold.c_str()), 0);
  late_commit.join();
  EXPECT_FALSE(late.ok()) << "the deposed leader's commit was accepted";
  auto exited = cluster_->WaitReplica(a, seconds(20));
  ASSERT_TRUE(exited.has_value()) << "the deposed leader kept running";
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 3)
      << "wait status " << *exited;

  storage::LocalBackendOptions bo;
  bo.root = cluster_->shared_root();
  bo.remove_tmp_files = false;
  auto shared = storage::NewLocalBackend(bo);
  ASSERT_TRUE(shared.ok()) << shared.status();
  absl::StatusOr<storage::v1::GlobalManifest> m;
  EXPECT_TRUE(Cluster::WaitUntil(
      [&] {
        m = storage::ReadGlobalManifest(**shared, "job", 10);
        return m.ok() && m->fence() == b_fence;
      },
      seconds(20)))
      << (m.ok()
              ? "MANIFEST.global is still fence " + std::to_string(m->fence())
              : m.status().ToString());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->generation(), generation);
  EXPECT_EQ(m->shards(2).node_id(), "s1")
      << "rank 2's shard is the old timeline's";
  EXPECT_EQ(m->shards(3).key(), storage::ShardKey("job", 10, 3, "s1"));
  // B saw A's write (it landed) and wrote the committed one back (the
  // event follows the write: wait for it).
  std::string seen;
  EXPECT_TRUE(Cluster::WaitUntil(
      [&] {
        cv1::EventsResponse events;
        if (!call(&cv1::Coordinator::Stub::Events, stub_b.get(),
                  cv1::EventsRequest(), &events)
                 .ok())
          return false;
        seen.clear();
        bool rewritten = false;
        for (const auto& e : events.events()) {
          seen += cv1::EventKind_Name(e.kind()) + " " + e.detail() + "\n";
          rewritten |= e.kind() == cv1::MANIFEST_INVALID &&
                       e.detail().find("written again") != std::string::npos;
        }
        return rewritten;
      },
      seconds(20)))
      << "the deposed leader's write never landed, or was never replaced\n"
      << seen;
  EXPECT_NE(ReplicaLog(a).find("TEST-ONLY FAULT: holding"), std::string::npos)
      << ReplicaLog(a);
}

}  // namespace
}  // namespace ckpt::testing
