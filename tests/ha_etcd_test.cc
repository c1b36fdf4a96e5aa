// High availability at the etcd level (fixture: tests/ha_fixture.h): a
// KvBackend holding an ended leadership's fence writes nothing, a group
// write larger than one Txn lands in order, a standby redirects a job watch
// to the leader, and etcd over mutual TLS serves only our certificates.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "tests/ha_fixture.h"

namespace ckpt::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The fence itself, below the process: a KvBackend holding the fence of a
// leadership that ended (lease revoked, another replica elected) writes
// nothing, whatever its own clock says.
TEST_F(HaTest,
       EtcdWriteWithTheFenceOfAnEndedLeadershipIsRefusedAndChangesNothing) {
  auto client = EtcdClientOf(1, 2);
  etcd::ElectionOptions eo = Election("/fence-test/", "first:1");
  auto first = std::make_unique<etcd::LeaderElection>(client, eo);
  absl::StatusOr<etcd::Fence> first_fence = first->Campaign();
  ASSERT_TRUE(first_fence.ok()) << first_fence.status();
  std::string fenced_reason;
  auto stale =
      etcd::NewEtcdKv(client, "/fence-test/", *first_fence,
                      [&](const std::string& why) { fenced_reason = why; });
  ASSERT_TRUE(stale->Write({{false, "k", "from the first leader"}}).ok());
  first.reset();  // resigns: the lease is revoked, the key goes

  eo.advertise = "second:1";
  etcd::LeaderElection second(client, eo);
  absl::StatusOr<etcd::Fence> second_fence = second.Campaign();
  ASSERT_TRUE(second_fence.ok()) << second_fence.status();
  EXPECT_GT(second_fence->create_revision, first_fence->create_revision);
  EXPECT_EQ(second.leader(), "second:1");

  absl::Status refused = stale->Write(
      {{false, "k", "from the deposed leader"}, {true, "other", ""}});
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_NE(fenced_reason.find("no longer the leader"), std::string::npos)
      << fenced_reason;
  auto fresh = etcd::NewEtcdKv(client, "/fence-test/", *second_fence, nullptr);
  auto value = fresh->Get("k");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(value->value_or(""), "from the first leader");
  EXPECT_TRUE(fresh->Write({{false, "k", "from the second leader"}}).ok());
}

TEST_F(HaTest,
       StandbyEndsTheJobWatchNotLeaderNamingTheLeaderAndTheLeaderServesIt) {
  cluster_ = std::make_unique<Cluster>(Options(2));
  cluster_->StartCoordinator();
  int leader = cluster_->LeaderReplica();
  ASSERT_GE(leader, 0);
  const int standby = 1 - leader;
  cv1::WatchJobRequest req;
  req.set_job("job");
  req.set_node_id("n1");
  auto watch = [&](int replica, cv1::JobView* view) {
    auto stub = cv1::CoordinatorWatch::NewStub(grpc::CreateChannel(
        cluster_->ReplicaAddress(replica), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    auto reader = stub->WatchJob(&ctx, req);
    bool got = reader->Read(view);
    if (got) ctx.TryCancel();
    grpc::Status s = reader->Finish();
    return got ? grpc::Status::OK : s;
  };
  cv1::JobView view;
  grpc::Status s;
  // The standby names the leader once it has read the election key.
  Cluster::WaitUntil(
      [&] {
        s = watch(standby, &view);
        return !s.ok() && !coordinator::LeaderHint(s).empty();
      },
      seconds(20));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(coordinator::LeaderHint(s), cluster_->ReplicaAddress(leader))
      << s.error_message();
  s = watch(leader, &view);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(view.job(), "job");
}

TEST_F(HaTest,
       EtcdGroupWriteOverOneTxnsLimitLandsInOrderAndAStaleFenceRefusesIt) {
  auto client = EtcdClientOf(0, 1);
  etcd::ElectionOptions eo = Election("/group-test/", "first:1");
  auto first = std::make_unique<etcd::LeaderElection>(client, eo);
  absl::StatusOr<etcd::Fence> fence = first->Campaign();
  ASSERT_TRUE(fence.ok()) << fence.status();
  auto kv = etcd::NewEtcdKv(client, "/group-test/", *fence, nullptr);
  // 300 one-op batches (over etcd's default 128 operations per Txn), the
  // last of them overwriting the first key: every batch lands, in order.
  std::vector<coordinator::KvBatch> batches;
  for (int i = 0; i < 299; ++i)
    batches.push_back(
        {{false, "k/" + std::to_string(1000 + i), std::to_string(i)}});
  batches.push_back({{false, "k/1000", "last"}});
  std::vector<const coordinator::KvBatch*> group;
  for (const auto& b : batches) group.push_back(&b);
  ASSERT_TRUE(kv->WriteGroup(group).ok());
  int keys = 0;
  ASSERT_TRUE(kv->Scan("k/", [&](const std::string&, const std::string&) {
                  ++keys;
                  return absl::OkStatus();
                }).ok());
  EXPECT_EQ(keys, 299);
  EXPECT_EQ(kv->Get("k/1000")->value_or(""), "last");
  EXPECT_EQ(kv->Get("k/1298")->value_or(""), "298");

  first.reset();  // resigns; a second leader's key has another revision
  eo.advertise = "second:1";
  etcd::LeaderElection second(client, eo);
  ASSERT_TRUE(second.Campaign().ok());
  for (auto& b : batches) b[0].value = "stale";
  absl::Status refused = kv->WriteGroup(group);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_EQ(kv->Get("k/1000")->value_or(""), "last");
  EXPECT_EQ(kv->Get("k/1001")->value_or(""), "1");
}

// The coordinator's connection to etcd can be mutual TLS: an etcd that
// takes only client certificates of its CA serves the coordinator given
// --etcd-tls-*; a plaintext client, a certificate of another CA and a
// coordinator without the files get nothing from it.
TEST_F(HaTest,
       EtcdOverMutualTlsServesTheCoordinatorWithItsCertificateAndNoOneElse) {
#ifndef MAKE_CERTS_SCRIPT
  GTEST_SKIP() << "openssl was not found when this test was configured";
#else
  const std::string certs = dir_.path() + "/certs";
  CommandResult made = RunCommand("sh " MAKE_CERTS_SCRIPT " " + certs);
  ASSERT_EQ(made.exit_code, 0) << made.out;
  coordinator::TlsFiles tls;
  tls.cert = certs + "/coordinator.pem";
  tls.key = certs + "/coordinator.key";
  tls.ca = certs + "/ca.pem";
  EtcdCluster secure(dir_.path() + "/etcd-tls", 1, tls);
  std::string why;
  ASSERT_TRUE(secure.WaitHealthy(&why)) << why;
  etcdserverpb::RangeRequest probe;
  probe.set_key("/tls-test/leader");
  etcd::EtcdClient plain({secure.Endpoint(0)}, seconds(1));
  EXPECT_FALSE(plain.Range(probe).ok()) << "plaintext client served";
  coordinator::TlsFiles other = tls;
  other.cert = certs + "/n1-other.pem";
  other.key = certs + "/n1-other.key";
  etcd::EtcdClient stranger({secure.Endpoint(0)}, seconds(1),
                            coordinator::LoadClientCredentials(other).value());
  EXPECT_FALSE(stranger.Range(probe).ok())
      << "certificate of another CA served";
  etcd::EtcdClient trusted({secure.Endpoint(0)}, seconds(2),
                           coordinator::LoadClientCredentials(tls).value());

  auto start = [&](const std::string& name, bool with_tls) {
    std::vector<std::string> argv = {
        COORDINATOR_BINARY, "--listen",
        "127.0.0.1:0",      "--insecure",
        "--state",          "etcd://" + secure.Endpoint(0) + "/tls-test",
        "--shared-root",    dir_.path() + "/shared",
        "--advertise-addr", name + ":1"};
    if (with_tls)
      argv.insert(argv.end(), {"--etcd-tls-cert", tls.cert, "--etcd-tls-key",
                               tls.key, "--etcd-tls-ca", tls.ca});
    return Proc::Spawn(argv, dir_.path() + "/" + name + ".log");
  };
  // Without the files first: it must not lead, and writes nothing.
  auto without = start("without", false);
  ASSERT_TRUE(Cluster::WaitUntil(
      [&] {
        return ReadFileToString(dir_.path() + "/without.log")
                   .find("election:") != std::string::npos;
      },
      seconds(20)))
      << ReadFileToString(dir_.path() + "/without.log");
  auto none = trusted.Range(probe);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->kvs_size(), 0)
      << "a coordinator without the files wrote the election key";

  auto with = start("with", true);
  std::string leader;
  Cluster::WaitUntil(
      [&] {
        auto seen = trusted.Range(probe);
        leader = seen.ok() && seen->kvs_size() > 0 ? seen->kvs(0).value() : "";
        return !leader.empty();
      },
      seconds(20));
  EXPECT_EQ(leader, "with:1") << ReadFileToString(dir_.path() + "/with.log");
  EXPECT_NE(ReadFileToString(dir_.path() + "/without.log").find("etcd"),
            std::string::npos);
#endif
}

}  // namespace
}  // namespace ckpt::testing
