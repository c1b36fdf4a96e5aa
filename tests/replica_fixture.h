// Shared pieces of the peer-replica tests (replica_test.cc,
// replica_fetch_test.cc): in-process engines over real local backends and
// catalogs, a holder (ReplicaStore behind a real ReplicaServer on a
// loopback port), valid shard images, and raw calls to the Replica
// service. Not thread-safe: one test thread drives it.
#ifndef CKPT_TESTS_REPLICA_FIXTURE_H_
#define CKPT_TESTS_REPLICA_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/replica_metrics.h"
#include "daemon/replica/replica_service.h"
#include "daemon/replica/replica_store.h"
#include "daemon/replica/replicator.h"
#include "replica.grpc.pb.h"
#include "storage/backend.h"
#include "storage/shard_testing.h"
#include "tests/eventually.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {

namespace rv1 = ::ckpt::replica::v1;

// A shard image of (job, step, rank) of world ranks: one float32 tensor
// of `floats` random values (seed), valid checksums.
inline storage::Shard ReplicaImage(const std::string& job, uint64_t step,
                                   uint32_t rank, uint32_t world,
                                   uint64_t floats = 100000,
                                   uint32_t seed = 1) {
  storage::Shard s = storage::MakeShard({{floats}}, seed);
  s.info.job = job;
  s.info.step = step;
  s.info.rank = rank;
  s.info.world_size = world;
  EXPECT_TRUE(storage::EncodeShardMetadata(s.info, s.image).ok());
  return s;
}

inline rv1::ShardCopy CopyOf(const storage::Shard& s, uint64_t generation = 1,
                             const std::string& source = "a") {
  rv1::ShardCopy c;
  c.set_job(s.info.job);
  c.set_step(s.info.step);
  c.set_rank(s.info.rank);
  c.set_world_size(s.info.world_size);
  c.set_generation(generation);
  c.set_image_bytes(s.image.size());
  for (const auto& t : s.info.tensors) c.add_checksums(t.checksum);
  c.set_source_node(source);
  c.set_owner_uid(getuid());
  return c;
}

class ReplicaFixture : public ::testing::Test {
 protected:
  struct Node {
    std::string prefix;
    std::unique_ptr<storage::Backend> local;
    std::unique_ptr<daemon::Catalog> catalog;
    std::unique_ptr<daemon::Engine> engine;
    std::atomic<daemon::Replicator*> replicator{nullptr};
    // Sees every report the engine makes (set before its first save).
    std::function<void(const daemon::ShardReport&)> on_report;
  };

  void TearDown() override {
    // Stopped first, destroyed after the engines that call Staged().
    for (auto& r : replicators_) r->Stop();
    if (server_) server_->Shutdown();
    server_.reset();
    for (auto& n : nodes_) {
      n->engine.reset();
      UnlinkArenas(n->prefix);
    }
    replicators_.clear();
  }

  // An engine in cluster mode as node `id`, its storage root `root`
  // (nodes may share one: the shared root); `before_write` runs before
  // each write of its catalog (Catalog::SetBeforeWriteForTesting).
  Node& OpenNode(const std::string& id, const std::string& root,
                 std::function<void(bool sync)> before_write = {}) {
    auto n = std::make_unique<Node>();
    n->prefix = UniqueShmPrefix();
    storage::LocalBackendOptions lo;
    lo.root = root;
    lo.tmp_tag = id;
    auto local = storage::NewLocalBackend(lo);
    EXPECT_TRUE(local.ok()) << local.status();
    n->local = std::move(*local);
    auto cat = daemon::Catalog::Open(dir_.path() + "/catalog-" + id);
    EXPECT_TRUE(cat.ok()) << cat.status();
    n->catalog = std::move(*cat);
    if (before_write) n->catalog->SetBeforeWriteForTesting(before_write);
    daemon::EngineOptions eo;
    eo.shm_prefix = n->prefix;
    eo.node_id = id;
    Node* raw = n.get();
    eo.on_shard = [raw](const daemon::ShardReport& r) {
      if (raw->on_report) raw->on_report(r);
      if (auto* rep = raw->replicator.load(); rep && !r.failed)
        rep->Staged(r.job, r.step, r.rank, r.durable);
    };
    auto e = daemon::Engine::Open(eo, n->local.get(), n->catalog.get());
    EXPECT_TRUE(e.ok()) << e.status();
    n->engine = std::move(*e);
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }

  // The replicate stage of `node`, sending to `target`.
  daemon::Replicator& StartReplicator(
      Node& node, const std::string& id,
      std::optional<daemon::ReplicaPeer> target,
      std::chrono::milliseconds deadline = std::chrono::seconds(10),
      uint64_t bandwidth = 0) {
    daemon::ReplicatorOptions ro;
    ro.node_id = id;
    ro.bandwidth = bandwidth;
    ro.retry_delay = std::chrono::milliseconds(20);
    ro.max_retry_delay = std::chrono::milliseconds(200);
    ro.put_deadline = deadline;
    replicators_.push_back(std::make_unique<daemon::Replicator>(ro));
    daemon::Replicator& r = *replicators_.back();
    r.SetTarget(std::move(target));
    r.Start(node.engine.get());
    node.replicator = &r;
    return r;
  }

  // The holder "b": a store of `budget` bytes behind a replica listener.
  void StartHolder(
      uint64_t budget, coordinator::TlsFiles tls = {},
      daemon::StagedShards* staged = nullptr,
      std::chrono::milliseconds bulk_token_ttl = std::chrono::seconds(60)) {
    store_ = std::make_unique<daemon::ReplicaStore>(
        budget, [this](const rv1::ShardCopy& c) {
          absl::MutexLock lock(&evicted_mu_);
          evicted_.push_back(c);
        });
    daemon::ReplicaServerOptions so;
    so.host = "127.0.0.1";
    so.tls = tls;
    so.bulk_token_ttl = bulk_token_ttl;
    so.on_replicated = [this](const daemon::HeldReplica&) {
      // Called on the thread that received and verified the copy.
      replicated_nice_ = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
      ++replicated_;
    };
    auto s = daemon::ReplicaServer::Start(so, store_.get(), staged);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  daemon::ReplicaPeer Holder() const {
    return {"b", "127.0.0.1", static_cast<uint32_t>(server_->port())};
  }

  std::shared_ptr<grpc::Channel> Channel(const coordinator::TlsFiles& tls = {},
                                         const std::string& node = "b") {
    auto c = daemon::ReplicaChannel(tls, node, "127.0.0.1", server_->port());
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }
  absl::StatusOr<uint64_t> Put(const rv1::ShardCopy& copy,
                               const std::vector<char>& image,
                               grpc::Channel* channel = nullptr) {
    daemon::PutOptions po;
    po.deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
    auto c = channel ? nullptr : Channel();
    return daemon::PutReplica(channel ? *channel : *c, copy, image.data(), po);
  }
  // Get into a vector over `transport` (from the holder "b", or over
  // `channel`); the status on failure.
  absl::StatusOr<std::vector<char>> Get(
      const std::string& job, uint64_t step, uint32_t rank, bool replica = true,
      daemon::ReplicaTransport transport = daemon::ReplicaTransport::kGrpc,
      grpc::Channel* channel = nullptr) {
    rv1::GetRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_replica(replica);
    std::vector<char> out;
    auto c = channel ? nullptr : Channel();
    auto got = daemon::FetchReplica(
        transport, channel ? *channel : *c, "127.0.0.1", req,
        [&](const rv1::ShardCopy& c) -> absl::StatusOr<char*> {
          out.resize(c.image_bytes());
          return out.data();
        },
        std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!got.ok()) return got.status();
    return out;
  }
  // A raw Put of exactly these chunks.
  grpc::Status RawPut(const std::vector<rv1::PutChunk>& chunks) {
    auto stub = rv1::Replica::NewStub(Channel());
    grpc::ClientContext ctx;
    rv1::PutResponse resp;
    auto w = stub->Put(&ctx, &resp);
    for (const auto& c : chunks)
      if (!w->Write(c)) break;
    w->WritesDone();
    return w->Finish();
  }

  // The bytes an OpenRestore of the node's engine hands a trainer.
  absl::StatusOr<std::vector<char>> Restore(Node& node, const std::string& job,
                                            uint64_t step, uint32_t rank) {
    v1::OpenRestoreRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    daemon::PeerCreds peer{getpid(), getuid(), getgid()};
    auto r = node.engine->OpenRestore(peer, req);
    if (!r.ok()) return r.status();
    if (r->shm_name().empty())
      return absl::FailedPreconditionError("not restored from memory");
    const int fd = open(
        ("/dev/shm/" + r->shm_name().substr(r->shm_name()[0] == '/' ? 1 : 0))
            .c_str(),
        O_RDONLY);
    if (fd < 0) return absl::NotFoundError("shm " + r->shm_name());
    void* base = mmap(nullptr, r->arena_bytes(), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return absl::InternalError("mmap");
    const char* p = static_cast<const char*>(base) + r->slot_offset();
    std::vector<char> out(p, p + r->image_bytes());
    munmap(base, r->arena_bytes());
    return out;
  }

  TempDir dir_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<daemon::Replicator>> replicators_;
  std::unique_ptr<daemon::ReplicaStore> store_;
  std::unique_ptr<daemon::ReplicaServer> server_;
  std::atomic<int> replicated_{0};
  std::atomic<int> replicated_nice_{-100};  // of the last verifying thread
  // The copies the holder's store handed to its eviction hook (what a
  // daemon withdraws), in order.
  std::vector<rv1::ShardCopy> Evicted() {
    absl::MutexLock lock(&evicted_mu_);
    return evicted_;
  }
  absl::Mutex evicted_mu_;
  std::vector<rv1::ShardCopy> evicted_ ABSL_GUARDED_BY(evicted_mu_);
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_REPLICA_FIXTURE_H_
