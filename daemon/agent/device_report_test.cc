// A shard whose tensors were committed
// without a checksum (device tensors: the daemon computes it while
// persisting) must become globally durable. The engine's STAGED and DURABLE
// reports go, as the node agent sends them, to a real in-process
// Coordinator; the step must become its last good step, and the global
// manifest must carry the digest of the checksums in the shard file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "coordinator/coordinator.h"
#include "daemon/agent/node_agent.h"
#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "storage/manifest.h"
#include "storage/shard_reader.h"
#include "tests/engine_save.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;

TEST(DeviceReportTest, ShardCommittedWithoutChecksumsBecomesTheLastGoodStep) {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  const std::string prefix = UniqueShmPrefix();

  coordinator::CoordinatorOptions co;
  co.state_dir = dir.path() + "/state";
  co.shared_root = shared;
  int64_t now_ms = 1'000'000;
  co.now_ms = [&] { return now_ms; };
  auto coord = coordinator::Coordinator::Open(co);
  ASSERT_TRUE(coord.ok()) << coord.status();
  cv1::RegisterNodeRequest nr;
  nr.set_node_id("a");
  nr.set_address("a:1");
  nr.set_capacity(1);
  auto node = (*coord)->RegisterNode(nr);
  ASSERT_TRUE(node.ok()) << node.status();
  cv1::RegisterJobRequest jr;
  jr.set_job("gpu");
  jr.set_world_size(1);
  ASSERT_TRUE((*coord)->RegisterJob(jr).ok());

  storage::LocalBackendOptions lo;
  lo.root = shared;
  auto local = storage::NewLocalBackend(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  auto catalog = daemon::Catalog::Open(dir.path() + "/catalog");
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::mutex mu;
  std::vector<daemon::ShardReport> reports;
  daemon::EngineOptions eo;
  eo.shm_prefix = prefix;
  eo.node_id = "a";
  eo.on_shard = [&](const daemon::ShardReport& r) {
    std::lock_guard<std::mutex> l(mu);
    reports.push_back(r);
  };
  auto engine = daemon::Engine::Open(eo, local->get(), catalog->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->SetHostedRanks("gpu", {0}, std::nullopt);

  daemon::PeerCreds peer{getpid(), getuid(), getgid()};
  std::unique_ptr<shm::Arena> arena;
  OneTensorSave save{"gpu", 1};
  save.device = true;
  ASSERT_TRUE(SaveOneTensorStep(engine->get(), peer, save, &arena).ok());
  v1::WaitDurableRequest w;
  w.set_job("gpu");
  w.set_step(1);
  w.set_timeout_ms(20000);
  ASSERT_TRUE((*engine)->WaitDurable(peer, w).ok());

  std::vector<daemon::ShardReport> sent;
  {
    std::lock_guard<std::mutex> l(mu);
    sent = reports;
  }
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_FALSE(sent[0].durable);
  EXPECT_TRUE(sent[1].durable);
  for (const daemon::ShardReport& r : sent) {
    cv1::ReportShardsRequest req;
    req.set_node_id("a");
    req.set_epoch(node->epoch());
    daemon::ToReportProto(r, req.add_reports());
    auto resp = (*coord)->ReportShards(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->results(0).code(), 0)
        << (r.durable ? "DURABLE: " : "STAGED: ") << resp->results(0).message();
  }
  cv1::JobRecord job;
  const cv1::GetClusterResponse cluster = (*coord)->GetCluster();
  for (const auto& j : cluster.jobs())
    if (j.job() == "gpu") job = j;
  ASSERT_TRUE(job.has_last_good());
  EXPECT_EQ(job.last_good_step(), 1u);

  // The manifest's digest is that of the checksums the file holds (what
  // ckptctl verify compares), not of the zeros committed.
  auto m = storage::ReadGlobalManifest(**local, "gpu", 1);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards_size(), 1);
  auto info = storage::ReadShardInfo(**local, m->shards(0).key());
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<uint64_t> sums;
  for (const auto& t : info->tensors) sums.push_back(t.checksum);
  ASSERT_NE(sums[0], 0u);
  EXPECT_EQ(m->shards(0).checksum_digest(),
            storage::DigestHex(storage::ChecksumsDigest(sums)));

  engine->reset();
  UnlinkArenas(prefix);
}

}  // namespace
}  // namespace ckpt::testing
