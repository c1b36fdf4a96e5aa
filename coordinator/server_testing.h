// Test fixture: a real CoordinatorServer on loopback over a real RocksDB
// state, and real node agents (ckptd's, without an engine) talking to it.
// The state may sit behind a FaultyKv, which fails a group write (the
// coordinator reloads) or loses it and everything after it (what a
// coordinator SIGKILLed before its write was synced leaves behind; the test
// then restarts the server on the same state). The coordinator's clock is
// the real monotonic one plus skew_ms_, so a test can make a node's
// heartbeat time out at once. Not thread-safe: one test thread drives it.
#ifndef CKPT_COORDINATOR_SERVER_TESTING_H_
#define CKPT_COORDINATOR_SERVER_TESTING_H_

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/rocks_kv.h"
#include "coordinator/service.h"
#include "daemon/agent/node_agent.h"
#include "tests/temp_dir.h"

namespace ckpt::coordinator {

// A KvBackend over another whose group writes `rule` may fail or lose.
class FaultyKv : public KvBackend {
 public:
  enum class Fault { kNone, kFail, kLose };
  using Rule = std::function<Fault(const std::vector<const KvBatch*>&)>;

  FaultyKv(std::unique_ptr<KvBackend> base, Rule rule)
      : base_(std::move(base)), rule_(std::move(rule)) {}

  // Whether a group matched by the rule (failed or lost) was seen.
  bool fired() const { return fired_.load(); }

  // True when some batch of the group deletes a key under `prefix`.
  static bool Deletes(const std::vector<const KvBatch*>& batches,
                      const std::string& prefix) {
    for (const KvBatch* b : batches)
      for (const KvOp& op : *b)
        if (op.is_delete && op.key.rfind(prefix, 0) == 0) return true;
    return false;
  }

  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    return base_->Get(key);
  }
  absl::Status Scan(
      const std::string& prefix,
      const std::function<absl::Status(const std::string&, const std::string&)>&
          visit) override {
    return base_->Scan(prefix, visit);
  }
  absl::Status Write(const KvBatch& batch) override {
    return WriteGroup({&batch});
  }
  absl::Status WriteGroup(const std::vector<const KvBatch*>& batches) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return absl::OkStatus();  // "dead": nothing lands any more
    switch (rule_ ? rule_(batches) : Fault::kNone) {
      case Fault::kNone:
        return base_->WriteGroup(batches);
      case Fault::kFail:
        fired_ = true;
        return absl::UnavailableError("injected: group write failed");
      case Fault::kLose:
        fired_ = true;
        lost_ = true;
        return absl::OkStatus();
    }
    return absl::InternalError("unreachable");
  }
  std::string Describe() const override {
    return "faulty " + base_->Describe();
  }

 private:
  std::unique_ptr<KvBackend> base_;
  Rule rule_;
  std::mutex mu_;
  bool lost_ = false;
  std::atomic<bool> fired_{false};
};

class ServerTest : public ::testing::Test {
 protected:
  // Opens the state (behind a FaultyKv with `rule` when given) and serves
  // it on `port` (0: any).
  void Start(int port = 0, int max_inflight_reports = 16,
             FaultyKv::Rule rule = nullptr) {
    CoordinatorOptions o;
    o.state_dir = dir_.path() + "/state";
    o.shared_root = dir_.path() + "/shared";
    o.heartbeat_timeout = std::chrono::milliseconds(heartbeat_timeout_ms_);
    o.heartbeat_interval_nodes = heartbeat_interval_nodes_;
    o.now_ms = [this] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count() +
             skew_ms_.load();
    };
    std::filesystem::create_directories(o.state_dir);
    auto rocks = OpenRocksKv(o.state_dir + "/db");
    ASSERT_TRUE(rocks.ok()) << rocks.status();
    faulty_ = nullptr;
    std::unique_ptr<KvBackend> kv = std::move(*rocks);
    if (rule) {
      auto f = std::make_unique<FaultyKv>(std::move(kv), std::move(rule));
      faulty_ = f.get();
      kv = std::move(f);
    }
    auto c = Coordinator::Open(o, std::move(kv));
    ASSERT_TRUE(c.ok()) << c.status();
    ServerLimits limits;
    limits.max_inflight_reports = max_inflight_reports;
    limits.max_threads = max_threads_;
    auto s = CoordinatorServer::Start(
        std::move(*c), "127.0.0.1:" + std::to_string(port), limits);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }
  // The coordinator goes away (its lost writes stay lost) and comes back
  // on the same state and port, without faults.
  void Restart() {
    int port = server_->port();
    faulty_ = nullptr;
    server_.reset();
    Start(port);
  }
  std::string Address() const {
    return "127.0.0.1:" + std::to_string(server_->port());
  }
  template <typename Pred>
  bool Eventually(Pred pred,
                  std::chrono::seconds limit = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return pred();
  }
  v1::JobRecord Job() {
    v1::GetClusterResponse cluster = server_->coordinator()->GetCluster();
    for (const auto& j : cluster.jobs())
      if (j.job() == "job") return j;
    return {};
  }
  void RegisterJob(uint32_t world_size) {
    v1::RegisterJobRequest req;
    req.set_job("job");
    req.set_world_size(world_size);
    ASSERT_TRUE(server_->coordinator()->RegisterJob(req).ok());
  }
  int CountEvents(v1::EventKind kind, const std::string& containing = "") {
    int n = 0;
    const v1::EventsResponse events = server_->coordinator()->Events({});
    for (const auto& e : events.events())
      if (e.kind() == kind && e.detail().find(containing) != std::string::npos)
        ++n;
    return n;
  }
  // A trainer of `rank` on `node` died: the coordinator makes a plan.
  void TrainerDied(const std::string& node, uint64_t epoch, uint32_t rank) {
    v1::ReportTrainerExitRequest exit;
    exit.set_node_id(node);
    exit.set_epoch(epoch);
    exit.set_job("job");
    exit.set_rank(rank);
    exit.set_term_signal(9);
    auto r = server_->coordinator()->ReportTrainerExit(exit);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->failure());
  }
  std::unique_ptr<daemon::NodeAgent> Agent(const std::string& id = "n1",
                                           size_t remembered_orders = 1024) {
    daemon::NodeAgentOptions o;
    o.remembered_orders = remembered_orders;
    o.coordinator = Address();
    o.node_id = id;
    o.address = "127.0.0.1:1";
    o.capacity = 2;
    o.rpc_timeout = std::chrono::milliseconds(2000);
    auto agent = std::make_unique<daemon::NodeAgent>(o);
    agent->Start(nullptr);
    return agent;
  }
  static daemon::ShardReport Shard(uint32_t rank, bool durable,
                                   uint64_t step = 3) {
    daemon::ShardReport r;
    r.job = "job";
    r.step = step;
    r.rank = rank;
    r.durable = durable;
    r.bytes = 100 + rank;
    r.digest = 7 + rank;
    if (durable)
      r.key =
          "job/step-" + std::to_string(step) + "/rank-" + std::to_string(rank);
    return r;
  }

  ckpt::testing::TempDir dir_;
  int heartbeat_timeout_ms_ = 1000;
  uint32_t heartbeat_interval_nodes_ = 2048;
  int max_threads_ = 256;  // the synchronous server's thread pool
  std::atomic<int64_t> skew_ms_{0};
  FaultyKv* faulty_ = nullptr;  // owned by the coordinator
  std::unique_ptr<CoordinatorServer> server_;
};

// One node's ReportShards: ranks' STAGED or DURABLE reports of job "job"
// at `step` (DURABLE ones with a key), as a node agent batches them.
inline v1::ReportShardsRequest NodeBatch(const std::string& node,
                                         uint64_t epoch, uint64_t step,
                                         std::vector<uint32_t> ranks,
                                         v1::ShardState state) {
  v1::ReportShardsRequest req;
  req.set_node_id(node);
  req.set_epoch(epoch);
  for (uint32_t r : ranks) {
    v1::ShardReport* s = req.add_reports();
    s->set_job("job");
    s->set_step(step);
    s->set_rank(r);
    s->set_state(state);
    s->set_bytes(1000 + r);
    s->set_checksum_digest(0xabc0 + r);
    if (state == v1::DURABLE)
      s->set_key("job/step-" + std::to_string(step) + "/rank-" +
                 std::to_string(r));
  }
  return req;
}

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SERVER_TESTING_H_
