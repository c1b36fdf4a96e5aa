// HaTest: the fixture of the high-availability tests (ha_test.cc: leaders
// killed and stopped under a running job; ha_etcd_test.cc: fencing, group
// writes, watch redirects and mutual TLS at the etcd level) — a
// three-member etcd cluster on loopback and, where a test makes one, the
// multi-node cluster of tests/cluster_harness.h.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "coordinator/client/leader_channel.h"
#include "coordinator/etcd/election.h"
#include "coordinator/etcd/etcd_kv.h"
#include "storage/manifest.h"
#include "tests/cluster_harness.h"
#include "tests/etcd_harness.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace ckpt::testing {

namespace cv1 = ::ckpt::coord::v1;
namespace etcd = ::ckpt::coordinator::etcd;

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    etcd_ = std::make_unique<EtcdCluster>(dir_.path() + "/etcd", 3);
    std::string why;
    ASSERT_TRUE(etcd_->WaitHealthy(&why)) << why;
  }
  void TearDown() override {
    if (HasFailure() || std::getenv("CKPT_TEST_LOGS")) {
      if (cluster_) std::fprintf(stderr, "%s", cluster_->DumpLogs().c_str());
      std::fprintf(stderr, "%s", etcd_->Logs().c_str());
    }
  }
  ClusterOptions Options(int replicas) {
    ClusterOptions o;
    o.dir = dir_.path() + "/cluster";
    o.coordinator_state = etcd_->StateUrl("ckpt-test");
    o.coordinator_replicas = replicas;
    return o;
  }
  uint64_t LastGood() const {
    auto job = cluster_->Job();
    return job && job->has_last_good() ? job->last_good_step() : 0;
  }
  int CountEvents(cv1::EventKind kind) const {
    int n = 0;
    for (const auto& e : cluster_->Events())
      if (e.kind() == kind) ++n;
    return n;
  }
  // A leader-following client of every replica.
  std::unique_ptr<coordinator::CoordinatorClient> Client() const {
    return coordinator::CoordinatorClient::Create(
               cluster_->CoordinatorAddresses(), {})
        .value();
  }
  // A client of etcd members a and b (2 s per call).
  std::shared_ptr<etcd::EtcdClient> EtcdClientOf(int a, int b) const {
    return std::make_shared<etcd::EtcdClient>(
        std::vector<std::string>{etcd_->Endpoint(a), etcd_->Endpoint(b)},
        std::chrono::seconds(2));
  }
  // An election on `prefix`leader with a 2 s lease, advertising `who`.
  static etcd::ElectionOptions Election(const std::string& prefix,
                                        const std::string& who) {
    etcd::ElectionOptions eo;
    eo.key = prefix + "leader";
    eo.ttl_s = 2;
    eo.advertise = who;
    return eo;
  }
  std::string ReplicaLog(int i) const {
    return ReadFileToString(
        dir_.path() + "/cluster" +
        (i == 0 ? "/coordinator.log"
                : "/coordinator-" + std::to_string(i) + ".log"));
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::unique_ptr<Cluster> cluster_;
};

}  // namespace ckpt::testing
