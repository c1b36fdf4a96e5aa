// Peer replicas end to end, with real processes: four ckptd's in four failure
// domains joined to the real ckpt-coordinator binary (rank 0 on a, rank 1
// on b, h holding replicas, s the spare). Nothing a and b save becomes
// durable (their storage writes hang: CKPTD_TEST_FAULT), so storage alone
// would restart the job from scratch. b is SIGKILLed: the plan restores
// the newest staged step, rank 1 fetched onto the spare from h's replica,
// and the bytes restored there are the ones b's trainer saved.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "ckpt/client.h"
#include "coordinator.grpc.pb.h"
#include "tests/coordinator_process.h"
#include "tests/harness.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

bool WaitUntil(const std::function<bool()>& done, seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

cv1::GetClusterResponse Cluster(const CoordinatorProcess& coordinator) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  cv1::GetClusterResponse c;
  grpc::Status s = coordinator.Stub()->GetCluster(&ctx, {}, &c);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return c;
}

TEST(ReplicaRecoveryTest, ALostNodesRankIsRestoredBitIdenticalFromItsPeer) {
  TempDir dir;
  ArenaPrefixes arenas;  // outlives the daemons below
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(shared);
  CoordinatorProcess coordinator(dir.path() + "/coord", shared, 2000);
  ASSERT_GT(coordinator.port(), 0);
  const std::vector<int> ports = FreeLoopbackPorts(4);
  auto start = [&](const std::string& id, const std::string& domain, int port,
                   bool spare, bool hang_persist) {
    std::vector<std::string> args = {
        "--coordinator", coordinator.address(), "--insecure", "--node-id", id,
        "--advertise-addr", "127.0.0.1", "--shared-root", shared, "--capacity",
        "1", "--domain", domain, "--replica-port", std::to_string(port),
        // 1.7 s a copy: a step's copies are
        // still on the wire when the next
        // step's saves return.
        "--replica-bandwidth", "5000000"};
    if (spare) args.push_back("--spare");
    std::filesystem::create_directories(dir.path() + "/" + id);
    if (hang_persist) setenv("CKPTD_TEST_FAULT", "hang-persist-writes", 1);
    auto d = DaemonProcess::Start(dir.path() + "/" + id + "/root",
                                  dir.path() + "/" + id, arenas.New(), args);
    unsetenv("CKPTD_TEST_FAULT");
    return d;
  };
  auto a = start("a", "rack-a", ports[0], false, true);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = start("b", "rack-b", ports[1], false, true);
  ASSERT_TRUE(b.ok()) << b.status();
  auto h = start("h", "rack-c", ports[2], false, false);
  ASSERT_TRUE(h.ok()) << h.status();
  auto s = start("s", "rack-d", ports[3], true, false);
  ASSERT_TRUE(s.ok()) << s.status();
  // Every node registered and healthy before the job is placed: a node
  // whose start check still runs (a loaded machine) gets no ranks, and
  // rank 1 would not land on b.
  ASSERT_TRUE(WaitUntil(
      [&] {
        const cv1::GetClusterResponse c = Cluster(coordinator);
        int healthy = 0;
        for (const auto& n : c.nodes())
          healthy += n.health() == cv1::ALIVE &&
                     n.health_report().checks_size() > 0 && !n.unhealthy();
        return healthy == 4;
      },
      seconds(90)))
      << Cluster(coordinator).DebugString();
  {
    grpc::ClientContext ctx;
    cv1::RegisterJobRequest req;
    req.set_job("job");
    req.set_world_size(2);
    req.set_nproc_per_node(1);
    cv1::RegisterJobResponse resp;
    grpc::Status st = coordinator.Stub()->RegisterJob(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.job().rank_node(1), "b");
  }
  // b's replicas go to h (another domain; a sends to b).
  ASSERT_TRUE(WaitUntil(
      [&] {
        const cv1::GetClusterResponse c = Cluster(coordinator);
        for (const auto& n : c.nodes())
          if (n.node_id() == "b") return n.replica_target() == "h";
        return false;
      },
      seconds(30)));

  constexpr uint64_t kBytes = 8 << 20;
  std::vector<std::unique_ptr<Client>> clients;
  for (int rank : {0, 1}) {
    absl::StatusOr<std::unique_ptr<Client>> c =
        absl::UnavailableError("not yet");
    ASSERT_TRUE(WaitUntil(
        [&] {
          return (c = Client::Connect(
                      OptionsFor(rank == 0 ? **a : **b, "job", rank, 2)))
              .ok();
        },
        seconds(30)))
        << c.status();
    clients.push_back(std::move(*c));
  }
  // Two steps (a slot whose persist hangs is not written again).
  HostState saved;
  for (uint64_t step : {1u, 2u})
    for (int rank : {0, 1}) {
      HostState st = MakeState(kBytes, 4, 100 * step + rank);
      ASSERT_TRUE(clients[rank]->Save(step, st.tensors).ok());
      if (step == 2 && rank == 1) saved = std::move(st);
    }
  // Every rank of step 2 is staged, and b's rank is replicated on h.
  ASSERT_TRUE(WaitUntil(
      [&] {
        cv1::GetClusterResponse c = Cluster(coordinator);
        // Both ranks of step 2: b's own (rank 1) must be held elsewhere
        // before b dies, not only a's. (replicated_ranks also counts a
        // rank whose only copy is of step 1: b's step-2 copy could still
        // be on the wire when b is killed, as CI once saw.)
        return c.memory_size() == 1 && c.memory(0).memory_step() == 2 &&
               c.memory(0).has_replicated_step() &&
               c.memory(0).replicated_step() == 2;
      },
      seconds(60)))
      << Cluster(coordinator).DebugString();
  EXPECT_FALSE(Cluster(coordinator).jobs(0).has_last_good());

  clients[1].reset();
  (*b)->Kill(SIGKILL);
  ASSERT_TRUE(WaitUntil(
      [&] {
        cv1::GetClusterResponse c = Cluster(coordinator);
        return c.jobs(0).rank_node(1) == "s" &&
               c.jobs(0).plan_state() == cv1::PLAN_ACKNOWLEDGED;
      },
      seconds(60)))
      << Cluster(coordinator).DebugString();
  cv1::GetClusterResponse c = Cluster(coordinator);
  ASSERT_TRUE(c.jobs(0).has_restore_step());
  EXPECT_EQ(c.jobs(0).restore_step(), 2u) << "storage alone: from scratch";
  bool sourced = false;
  for (const auto& e : c.recent_events())
    if (e.kind() == cv1::RESTORE_SOURCES) {
      sourced = true;
      ASSERT_EQ(e.restore().ranks_size(), 1) << e.detail();
      EXPECT_EQ(e.restore().ranks(0).copy(), "replica") << e.detail();
      EXPECT_EQ(e.restore().ranks(0).node_id(), "h") << e.detail();
      EXPECT_EQ(e.restore().steps_lost(), 0u) << e.detail();
      EXPECT_EQ(e.restore().steps_lost_durable(), 2u) << e.detail();
    }
  EXPECT_TRUE(sourced);

  // The replacement restores rank 1 of step 2: the bytes b's trainer saved.
  auto on_spare = Client::Connect(OptionsFor(**s, "job", 1, 2));
  ASSERT_TRUE(on_spare.ok()) << on_spare.status();
  HostState got = saved.EmptyLike();
  absl::Status restored = (*on_spare)->Restore(2, got.tensors);
  ASSERT_TRUE(restored.ok()) << restored;
  EXPECT_TRUE(got.Equals(saved));
}

}  // namespace
}  // namespace ckpt::testing
