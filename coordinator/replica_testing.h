// The fixture of the replica tests: four nodes in four failure
// domains with replica listeners, a job of four ranks, and the calls a
// holder and a failure make. Not thread-safe.
#ifndef CKPT_COORDINATOR_REPLICA_TESTING_H_
#define CKPT_COORDINATOR_REPLICA_TESTING_H_

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {

constexpr uint32_t kPortBase = 7100;

// n1 (rack-a) hosts ranks 0-1, n2 (rack-b) ranks 2-3, n3 (rack-c) hosts
// nothing but holds replicas, s1 (rack-d) is the spare. Placement: n1's
// replicas go to n2, n2's to n3.
class ReplicaTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    e1_ = RegisterIn("n1", "rack-a", 2, 1);
    e2_ = RegisterIn("n2", "rack-b", 2, 2);
    e3_ = RegisterIn("n3", "rack-c", 1, 3);
    es_ = RegisterIn("s1", "rack-d", 2, 4, /*spare=*/true);
    RegisterJob("job", 4);
  }
  uint64_t RegisterIn(const std::string& node, const std::string& domain,
                      uint32_t capacity, uint32_t port_offset,
                      bool spare = false) {
    v1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_address(node + ":1");
    req.set_capacity(capacity);
    req.set_spare(spare);
    req.set_domain(domain);
    req.set_replica_port(kPortBase + port_offset);
    auto r = coord_->RegisterNode(req);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->epoch() : 0;
  }
  uint64_t EpochOf(const std::string& n) {
    return n == "n1" ? e1_ : n == "n2" ? e2_ : n == "n3" ? e3_ : es_;
  }
  void ReportAll(uint64_t step, v1::ShardState state) {
    for (uint32_t r = 0; r < 4; ++r) {
      const std::string node = r < 2 ? "n1" : "n2";
      auto s = Report(node, EpochOf(node), step, r, state);
      ASSERT_TRUE(s.ok()) << s.status();
    }
  }
  // A REPLICATED report of `holder` for `source`'s rank, as the fixture's
  // STAGED reports describe it; `tweak` changes it before it is sent.
  absl::Status Replicated(
      const std::string& holder, uint64_t step, uint32_t rank,
      const std::string& source,
      const std::function<void(v1::ShardReport&)>& tweak = nullptr,
      std::optional<uint64_t> epoch = std::nullopt) {
    v1::ReportShardsRequest req;
    req.set_node_id(holder);
    req.set_epoch(epoch.value_or(EpochOf(holder)));
    v1::ShardReport& r = *req.add_reports();
    r.set_job("job");
    r.set_step(step);
    r.set_rank(rank);
    r.set_state(v1::REPLICATED);
    r.set_bytes(1000 + rank);
    r.set_checksum_digest(0xabc0 + rank);
    r.set_source_node(source);
    if (tweak) tweak(r);
    auto resp = coord_->ReportShards(req);
    if (!resp.ok()) return resp.status();
    const v1::ReportResult& res = resp->results(0);
    return absl::Status(static_cast<absl::StatusCode>(res.code()),
                        res.message());
  }
  // Everyone but `silent` heartbeats once; a full timeout later the
  // failure detector's tick finds `silent` dead (and its plan is durable
  // when Tick returns).
  void Silence(const std::vector<std::string>& silent) {
    for (int beat = 0; beat < 2; ++beat) {
      for (const char* n : {"n1", "n2", "n3", "s1"}) {
        if (std::find(silent.begin(), silent.end(), n) != silent.end() ||
            Node(n).health() != v1::ALIVE)
          continue;
        ASSERT_TRUE(Heartbeat(n, EpochOf(n)).ok()) << n;
      }
      now_ms_ += 2000;
    }
    ASSERT_TRUE(coord_->Tick().ok());
    for (const std::string& n : silent)
      ASSERT_EQ(Node(n).health(), v1::DEAD) << n;
  }
  // Step 10 durable everywhere (last good), step 12 staged everywhere,
  // n2's ranks of step 12 replicated on n3.
  void StageAndReplicate() {
    ReportAll(10, v1::STAGED);
    ReportAll(10, v1::DURABLE);
    ReportAll(12, v1::STAGED);
    ASSERT_EQ(Job().last_good_step(), 10u);
    for (uint32_t r : {2u, 3u}) {
      absl::Status s = Replicated("n3", 12, r, "n2");
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  v1::JobMemory Memory() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (const auto& m : c.memory())
      if (m.job() == "job") return m;
    ADD_FAILURE() << "no memory entry for job";
    return {};
  }
  std::string State() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (auto& n : *c.mutable_nodes()) n.clear_ms_since_heartbeat();
    return c.SerializeAsString();
  }
  v1::Order OrderOf(const v1::HeartbeatResponse& hb, v1::OrderKind kind) {
    for (const auto& o : hb.orders())
      if (o.kind() == kind) return o;
    ADD_FAILURE() << "no " << v1::OrderKind_Name(kind) << " order in "
                  << hb.DebugString();
    return {};
  }
  uint64_t e1_ = 0, e2_ = 0, e3_ = 0, es_ = 0;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_REPLICA_TESTING_H_
