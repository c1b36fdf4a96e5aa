// Test fixture: a Coordinator on a temporary state directory and shared
// root, driven by a fake clock (no sleeping), with helpers for the calls a
// node makes. Not thread-safe.
#ifndef CKPT_COORDINATOR_COORDINATOR_TESTING_H_
#define CKPT_COORDINATOR_COORDINATOR_TESTING_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "storage/manifest.h"
#include "tests/gated_backend.h"
#include "tests/temp_dir.h"

namespace ckpt::coordinator {

// A GatedBackend that owns what it wraps
// (CoordinatorOptions::wrap_shared_root).
class OwningGate : public ckpt::testing::GatedBackend {
 public:
  explicit OwningGate(std::unique_ptr<storage::Backend> base)
      : GatedBackend(base.get()), base_(std::move(base)) {}

 private:
  std::unique_ptr<storage::Backend> base_;
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Reopen(); }

  // Drops the coordinator (as a crash would: nothing is flushed on the way
  // out that a commit did not already make durable) and opens it again.
  void Reopen() {
    absl::Status s = TryReopen();
    ASSERT_TRUE(s.ok()) << s;
  }
  // The same, returning why it could not open; `shared_root_wait` as in
  // CoordinatorOptions.
  absl::Status TryReopen(std::chrono::milliseconds shared_root_wait =
                             std::chrono::milliseconds(0)) {
    coord_.reset();
    CoordinatorOptions o;
    o.state_dir = dir_.path() + "/state";
    o.shared_root = dir_.path() + "/shared";
    o.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms_);
    o.heartbeat_interval_nodes = heartbeat_interval_nodes_;
    o.peer_probe_timeout = std::chrono::milliseconds(peer_probe_timeout_ms_);
    o.hang = hang_;
    o.cordon = cordon_;
    o.suspect = suspect_;
    o.evict_stragglers = evict_stragglers_;
    o.spare_wait_ms = spare_wait_ms_;
    o.max_failed_plans = max_failed_plans_;
    o.start_trainers_with_prefetch = start_trainers_with_prefetch_;
    o.shared_root_wait = shared_root_wait;
    o.now_ms = [this] { return now_ms_; };
    o.wrap_shared_root = wrap_shared_root_;
    auto c = Coordinator::Open(o);
    if (!c.ok()) return c.status();
    coord_ = std::move(*c);
    return absl::OkStatus();
  }

  uint64_t Register(const std::string& node, uint32_t capacity,
                    bool spare = false) {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_address(node + ":1");
    req.set_capacity(capacity);
    req.set_spare(spare);
    auto r = coord_->RegisterNode(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->epoch() : 0;
  }

  void RegisterJob(const std::string& job, uint32_t world_size) {
    v1::RegisterJobRequest req;
    req.set_job(job);
    req.set_world_size(world_size);
    auto r = coord_->RegisterJob(req);
    ASSERT_TRUE(r.ok()) << r.status();
  }

  [[nodiscard]] absl::StatusOr<v1::ReportShardResponse> Report(
      const std::string& node, uint64_t epoch, uint64_t step, uint32_t rank,
      v1::ShardState state, const std::string& job = "job") {
    v1::ReportShardRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_state(state);
    req.set_bytes(1000 + rank);
    req.set_checksum_digest(0xabc0 + rank);
    if (state == v1::DURABLE)
      req.set_key(job + "/step-" + std::to_string(step) + "/rank-" +
                  std::to_string(rank));
    return coord_->ReportShard(req);
  }

  [[nodiscard]] absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const std::string& node, uint64_t epoch,
      std::vector<uint64_t> acks = {}) {
    v1::HeartbeatRequest req;
    req.set_node_id(node);
    req.set_epoch(epoch);
    for (uint64_t a : acks) req.add_acked_order_ids(a);
    return coord_->Heartbeat(req);
  }

  v1::JobRecord Job(const std::string& job = "job") {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (const auto& j : c.jobs())
      if (j.job() == job) return j;
    ADD_FAILURE() << "no job " << job;
    return {};
  }

  v1::NodeRecord Node(const std::string& node) {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (const auto& n : c.nodes())
      if (n.node_id() == node) return n;
    ADD_FAILURE() << "no node " << node;
    return {};
  }

  // The events of `kind` in the log, oldest first.
  std::vector<v1::Event> EventsOf(v1::EventKind kind) {
    std::vector<v1::Event> out;
    const v1::EventsResponse events = coord_->Events({});
    for (const auto& e : events.events())
      if (e.kind() == kind) out.push_back(e);
    return out;
  }
  bool HasEvent(v1::EventKind kind) { return !EventsOf(kind).empty(); }

  ckpt::testing::TempDir dir_;
  int64_t now_ms_ = 1'000'000;
  int64_t heartbeat_timeout_ms_ = 3000;
  uint32_t heartbeat_interval_nodes_ = 2048;
  int64_t peer_probe_timeout_ms_ = 300;
  HangPolicy hang_;
  CordonPolicy cordon_;
  SuspectPolicy suspect_;
  bool evict_stragglers_ = false;
  int64_t spare_wait_ms_ = 0;       // CoordinatorOptions::spare_wait_ms
  uint32_t max_failed_plans_ = 10;  // CoordinatorOptions::max_failed_plans
  bool start_trainers_with_prefetch_ = true;
  std::function<std::unique_ptr<storage::Backend>(
      std::unique_ptr<storage::Backend>)>
      wrap_shared_root_;  // CoordinatorOptions::wrap_shared_root
  std::unique_ptr<Coordinator> coord_;
};

// Two active nodes with two ranks each and a spare; job "job", world 4.
class TwoNodeTest : public CoordinatorTest {
 protected:
  // The exit report of the trainer of `rank` on `node`: killed by
  // `term_signal`, or (signal 0) exited with `exit_code`.
  static v1::ReportTrainerExitRequest TrainerExit(const std::string& node,
                                                  uint64_t epoch, uint32_t rank,
                                                  int term_signal,
                                                  int exit_code = 0) {
    v1::ReportTrainerExitRequest exit;
    exit.set_node_id(node);
    exit.set_epoch(epoch);
    exit.set_job("job");
    exit.set_rank(rank);
    if (term_signal != 0) exit.set_term_signal(term_signal);
    if (exit_code != 0) exit.set_exit_code(exit_code);
    return exit;
  }
  void SetUp() override {
    CoordinatorTest::SetUp();
    e1_ = Register("n1", 2);
    e2_ = Register("n2", 2);
    es_ = Register("s1", 2, /*spare=*/true);
    RegisterJob("job", 4);
  }
  void ReportAll(uint64_t step, v1::ShardState state) {
    for (uint32_t r = 0; r < 4; ++r) {
      auto s = Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, step, r, state);
      ASSERT_TRUE(s.ok()) << s.status();
    }
  }
  absl::StatusOr<storage::v1::GlobalManifest> ReadManifest(uint64_t step) {
    storage::LocalBackendOptions bo;
    bo.root = dir_.path() + "/shared";
    bo.remove_tmp_files = false;
    auto backend = storage::NewLocalBackend(bo);
    if (!backend.ok()) return backend.status();
    return storage::ReadGlobalManifest(**backend, "job", step);
  }
  std::string ManifestPath(uint64_t step) {
    return dir_.path() + "/shared/" + storage::GlobalManifestKey("job", step);
  }
  uint64_t e1_ = 0, e2_ = 0, es_ = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_COORDINATOR_TESTING_H_
