// Test helpers for the tools that talk to the coordinator (ckptrun_test,
// ctl_coord_test): the real ckpt-coordinator binary
// (tests/coordinator_process.h), a fake node daemon (registers, heartbeats,
// acknowledges every order it receives, reports shards), and running a tool
// binary to completion. Not thread-safe, except FakeNode's own heartbeat
// thread.
#ifndef CKPT_TOOLS_CKPTRUN_TESTING_H_
#define CKPT_TOOLS_CKPTRUN_TESTING_H_

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "tests/coordinator_process.h"
#include "tests/test_util.h"

namespace ckpt::tools::testing {

namespace cv1 = ::ckpt::coord::v1;

using ::ckpt::testing::CoordinatorProcess;  // tests/coordinator_process.h

// A node daemon stand-in: heartbeats every 50 ms from its own thread and
// acknowledges every order in the next heartbeat, so plans reach
// PLAN_ACKNOWLEDGED (a PREFETCH only while ack_prefetch: a fetch that
// never ends).
class FakeNode {
 public:
  FakeNode(const std::string& coordinator, std::string id, std::string address,
           uint32_t capacity, bool spare = false,
           const std::string& domain = "", uint32_t replica_port = 0)
      : stub_(coordinator::NewCoordinatorStub(
            coordinator)),  // reconnects within 1 s of a coordinator restart
        id_(std::move(id)) {
    grpc::ClientContext ctx;
    // The channel bounds a connection attempt at 100 ms (channel.cc); a
    // coordinator on a loaded machine may answer later than that, so the
    // registration waits for the connection (the test's event), bounded.
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    cv1::RegisterNodeRequest req;
    req.set_node_id(id_);
    req.set_address(address);
    req.set_capacity(capacity);
    req.set_spare(spare);
    req.set_domain(domain);
    req.set_replica_port(replica_port);
    cv1::RegisterNodeResponse resp;
    status_ = stub_->RegisterNode(&ctx, req, &resp);
    epoch_ = resp.epoch();
    if (status_.ok()) thread_ = std::thread([this] { Loop(); });
  }
  ~FakeNode() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // This node holds a verified replica of `source`'s `rank` of `step`, as
  // ReportShard describes the save.
  grpc::Status ReportReplica(const std::string& job, uint64_t step,
                             uint32_t rank, const std::string& source) {
    grpc::ClientContext ctx;
    cv1::ReportShardsRequest req;
    req.set_node_id(id_);
    req.set_epoch(epoch_);
    cv1::ShardReport& r = *req.add_reports();
    r.set_job(job);
    r.set_step(step);
    r.set_rank(rank);
    r.set_state(cv1::REPLICATED);
    r.set_bytes(4096);
    r.set_checksum_digest(1000 + rank);
    r.set_source_node(source);
    cv1::ReportShardsResponse resp;
    grpc::Status s = stub_->ReportShards(&ctx, req, &resp);
    if (s.ok() && resp.results(0).code() != 0)
      return grpc::Status(static_cast<grpc::StatusCode>(resp.results(0).code()),
                          resp.results(0).message());
    return s;
  }
  const grpc::Status& status() const { return status_; }
  void set_ack_prefetch(bool ack) { ack_prefetch_ = ack; }
  uint64_t epoch() const { return epoch_; }

  // STAGED then DURABLE for `rank` of `step`, under the key ckptd would use.
  grpc::Status ReportShard(const std::string& job, uint64_t step, uint32_t rank,
                           cv1::ShardState state, const std::string& key) {
    grpc::ClientContext ctx;
    cv1::ReportShardRequest req;
    req.set_node_id(id_);
    req.set_epoch(epoch_);
    req.set_job(job);
    req.set_step(step);
    req.set_rank(rank);
    req.set_state(state);
    req.set_bytes(4096);
    req.set_checksum_digest(1000 + rank);
    if (state == cv1::DURABLE) req.set_key(key);
    cv1::ReportShardResponse resp;
    return stub_->ReportShard(&ctx, req, &resp);
  }

 private:
  void Loop() {
    std::vector<uint64_t> to_ack;
    while (!stop_) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
      cv1::HeartbeatRequest req;
      req.set_node_id(id_);
      req.set_epoch(epoch_);
      for (uint64_t id : to_ack) req.add_acked_order_ids(id);
      cv1::HeartbeatResponse resp;
      if (stub_->Heartbeat(&ctx, req, &resp).ok()) {
        to_ack.clear();
        for (const auto& o : resp.orders())
          if (o.kind() != cv1::PREFETCH || ack_prefetch_)
            to_ack.push_back(o.id());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  std::unique_ptr<cv1::Coordinator::Stub> stub_;
  std::string id_;
  uint64_t epoch_ = 0;
  grpc::Status status_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> ack_prefetch_{true};
  std::thread thread_;
};

using ::ckpt::testing::CommandResult;  // tests/test_util.h
using ::ckpt::testing::RunCommand;

}  // namespace ckpt::tools::testing

#endif  // CKPT_TOOLS_CKPTRUN_TESTING_H_
