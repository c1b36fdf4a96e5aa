// Mutual TLS on the coordinator, with the real ckpt-coordinator and ckptctl
// binaries and certificates made by openssl at test time
// (tests/make_certs.sh, the recipe of doc/security.md): a node speaks only
// for the node id its certificate names, a client without a certificate or
// with one of another CA (or in plaintext) never gets in, and Rollback needs
// an admin certificate.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "coordinator.grpc.pb.h"
#include "tests/cluster_harness.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::seconds;

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = dir_.path() + "/certs";
    CommandResult made = RunCommand("sh " MAKE_CERTS_SCRIPT " " + certs_);
    ASSERT_EQ(made.exit_code, 0) << made.out;
    log_ = dir_.path() + "/coordinator.log";
    coordinator_ = Proc::Spawn(
        {COORDINATOR_BINARY, "--listen", "127.0.0.1:0", "--state",
         dir_.path() + "/state", "--shared-root", dir_.path() + "/shared",
         "--tls-cert", Cert("coordinator"), "--tls-key", Key("coordinator"),
         "--tls-ca", Cert("ca"), "--relay-identities", "ckpt-relay,rack-2"},
        log_);
    ASSERT_TRUE(Cluster::WaitUntil(
        [&] {
          return ReadFileToString(log_).find("listening on") !=
                 std::string::npos;
        },
        seconds(20)))
        << ReadFileToString(log_);
    std::string line = ReadFileToString(log_);
    address_ = line.substr(line.find("listening on ") + 13);
    address_ = address_.substr(0, address_.find('\n'));
  }
  void TearDown() override {
    if (HasFailure())
      std::fprintf(stderr, "%s", ReadFileToString(log_).c_str());
  }
  std::string Cert(const std::string& name) const {
    return certs_ + "/" + name + ".pem";
  }
  std::string Key(const std::string& name) const {
    return certs_ + "/" + name + ".key";
  }

  // A stub presenting `name`'s certificate ("" for none), trusting `ca`.
  std::unique_ptr<cv1::Coordinator::Stub> Stub(
      const std::string& name, const std::string& ca = "ca") const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFileToString(Cert(ca));
    if (!name.empty()) {
      o.pem_cert_chain = ReadFileToString(Cert(name));
      o.pem_private_key = ReadFileToString(Key(name));
    }
    return cv1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::SslCredentials(o)));
  }
  static grpc::Status Register(cv1::Coordinator::Stub* stub,
                               const std::string& node,
                               cv1::RegisterNodeResponse* resp = nullptr) {
    cv1::RegisterNodeRequest req;
    req.set_node_id(node);
    req.set_address("127.0.0.1");
    req.set_capacity(1);
    cv1::RegisterNodeResponse ignored;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    return stub->RegisterNode(&ctx, req, resp ? resp : &ignored);
  }
  // A ckpt-relay presenting `name`'s certificate, to this coordinator;
  // its address once it listens ("" and a failure if it never does).
  std::string StartRelay(const std::string& name) {
    const std::string log = dir_.path() + "/relay-" + name + ".log";
    relays_.push_back(
        Proc::Spawn({RELAY_BINARY, "--listen", "127.0.0.1:0", "--coordinator",
                     address_, "--tls-cert", Cert(name), "--tls-key", Key(name),
                     "--tls-ca", Cert("ca"), "--relay-id", "rack-1"},
                    log));
    const bool up = Cluster::WaitUntil(
        [&] {
          return ReadFileToString(log).find("listening on") !=
                 std::string::npos;
        },
        seconds(20));
    EXPECT_TRUE(up) << ReadFileToString(log);
    if (!up) return "";
    std::string at = ReadFileToString(log);
    at = at.substr(at.find("listening on ") + 13);
    return at.substr(0, at.find('\n'));
  }
  // A stub to the relay at `at` presenting `name`'s certificate.
  std::unique_ptr<cv1::Coordinator::Stub> RelayStub(
      const std::string& at, const std::string& name) const {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFileToString(Cert("ca"));
    o.pem_cert_chain = ReadFileToString(Cert(name));
    o.pem_private_key = ReadFileToString(Key(name));
    return cv1::Coordinator::NewStub(
        grpc::CreateChannel(at, grpc::SslCredentials(o)));
  }
  CommandResult Ctl(const std::string& identity,
                    const std::string& args) const {
    std::string tls = identity.empty()
                          ? ""
                          : " --tls-cert " + Cert(identity) + " --tls-key " +
                                Key(identity) + " --tls-ca " + Cert("ca");
    return RunCommand(std::string(CKPTCTL_BINARY) + " --coordinator " +
                      address_ + tls + " " + args);
  }

  TempDir dir_;
  std::string certs_, log_, address_;
  std::unique_ptr<Proc> coordinator_;
  std::vector<std::unique_ptr<Proc>> relays_;
};

TEST_F(TlsTest, NodeWithACertificateForItsIdRegistersAndHeartbeats) {
  auto stub = Stub("n1");
  cv1::RegisterNodeResponse reg;
  grpc::Status s = Register(stub.get(), "n1", &reg);
  ASSERT_TRUE(s.ok()) << s.error_message();
  cv1::HeartbeatRequest hb;
  hb.set_node_id("n1");
  hb.set_epoch(reg.epoch());
  cv1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  EXPECT_TRUE(stub->Heartbeat(&ctx, hb, &resp).ok());
}

TEST_F(TlsTest, NodeWithACertificateForAnotherNodeIdIsRefused) {
  auto stub = Stub("n2");
  grpc::Status s = Register(stub.get(), "n1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find(
                "node_id \"n1\": the client certificate is for [n2"),
            std::string::npos)
      << s.error_message();
  // Nor may n2 heartbeat or report as n1 once n1 registered itself.
  cv1::RegisterNodeResponse reg;
  ASSERT_TRUE(Register(Stub("n1").get(), "n1", &reg).ok());
  cv1::ReportShardRequest report;
  report.set_node_id("n1");
  report.set_epoch(reg.epoch());
  report.set_job("job");
  cv1::ReportShardResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->ReportShard(&ctx, report, &resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(TlsTest, BatchedReportsAndTheJobWatchNeedTheNodesOwnCertificate) {
  cv1::RegisterNodeResponse reg;
  ASSERT_TRUE(Register(Stub("n1").get(), "n1", &reg).ok());
  auto channel = [&](const std::string& name) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadFileToString(Cert("ca"));
    o.pem_cert_chain = ReadFileToString(Cert(name));
    o.pem_private_key = ReadFileToString(Key(name));
    return grpc::CreateChannel(address_, grpc::SslCredentials(o));
  };
  // ReportShards (the batched reports) as n1 with n2's certificate.
  cv1::ReportShardsRequest batch;
  batch.set_node_id("n1");
  batch.set_epoch(reg.epoch());
  {
    cv1::ReportShardsResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = cv1::Coordinator::NewStub(channel("n2"))
                         ->ReportShards(&ctx, batch, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
    EXPECT_NE(s.error_message().find("ReportShards: node_id \"n1\""),
              std::string::npos)
        << s.error_message();
  }
  {
    cv1::ReportShardsResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = cv1::Coordinator::NewStub(channel("n1"))
                         ->ReportShards(&ctx, batch, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // The job watch (ckptrun's stream) likewise.
  cv1::WatchJobRequest watch;
  watch.set_job("job");
  watch.set_node_id("n1");
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    auto reader =
        cv1::CoordinatorWatch::NewStub(channel("n2"))->WatchJob(&ctx, watch);
    cv1::JobView view;
    EXPECT_FALSE(reader->Read(&view));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
    EXPECT_NE(s.error_message().find("WatchJob: node_id \"n1\""),
              std::string::npos)
        << s.error_message();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    auto reader =
        cv1::CoordinatorWatch::NewStub(channel("n1"))->WatchJob(&ctx, watch);
    cv1::JobView view;
    EXPECT_TRUE(reader->Read(&view));  // the current view comes at once
    ctx.TryCancel();
    reader->Finish();
  }
  // And the node's order watch (ckptd's stream): only n1 sees n1's orders.
  cv1::WatchNodeRequest orders;
  orders.set_node_id("n1");
  for (const char* caller : {"n2", "n1"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    auto reader = cv1::CoordinatorWatch::NewStub(channel(caller))
                      ->WatchNode(&ctx, orders);
    cv1::NodeView view;
    const bool read = reader->Read(&view);
    if (std::string(caller) == "n1") {
      EXPECT_TRUE(read);  // the current view comes at once
      ctx.TryCancel();
      reader->Finish();
      continue;
    }
    EXPECT_FALSE(read);
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
    EXPECT_NE(s.error_message().find("WatchNode: node_id \"n1\""),
              std::string::npos)
        << s.error_message();
  }
}

TEST_F(TlsTest, ClientWithoutACertificateIsRefusedAtTheHandshake) {
  grpc::Status s = Register(Stub("").get(), "n1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  std::fprintf(stderr, "no certificate: %s\n", s.error_message().c_str());
}

TEST_F(TlsTest, ClientWithACertificateOfAnotherCaIsRefusedAtTheHandshake) {
  grpc::Status s = Register(Stub("n1-other").get(), "n1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  std::fprintf(stderr, "certificate of another CA: %s\n",
               s.error_message().c_str());
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  auto stub = cv1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::Status s = Register(stub.get(), "n1");
  EXPECT_FALSE(s.ok());
}

TEST_F(TlsTest, CtlRollbackIsRefusedWithoutAnAdminCertificateAndWorksWithOne) {
  // A job with one durable step, reported by its node.
  auto n1 = Stub("n1");
  cv1::RegisterNodeResponse reg;
  ASSERT_TRUE(Register(n1.get(), "n1", &reg).ok());
  {
    cv1::RegisterJobRequest req;
    req.set_job("job");
    req.set_world_size(1);
    cv1::RegisterJobResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(n1->RegisterJob(&ctx, req, &resp).ok());
  }
  for (cv1::ShardState state : {cv1::STAGED, cv1::DURABLE}) {
    cv1::ReportShardRequest req;
    req.set_node_id("n1");
    req.set_epoch(reg.epoch());
    req.set_job("job");
    req.set_step(5);
    req.set_rank(0);
    req.set_state(state);
    req.set_bytes(1000);
    req.set_checksum_digest(0xabc);
    if (state == cv1::DURABLE) req.set_key("job/step-5/rank-0");
    cv1::ReportShardResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = n1->ReportShard(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  CommandResult as_node = Ctl("n1", "rollback --job job --step 5");
  EXPECT_NE(as_node.exit_code, 0) << as_node.out;
  EXPECT_NE(as_node.out.find("is not an admin identity"), std::string::npos)
      << as_node.out;
  CommandResult without = Ctl("", "rollback --job job --step 5");
  EXPECT_NE(without.exit_code, 0) << without.out;
  EXPECT_NE(without.out.find("give --tls-cert"), std::string::npos)
      << without.out;
  CommandResult as_admin = Ctl("admin", "rollback --job job --step 5");
  EXPECT_EQ(as_admin.exit_code, 0) << as_admin.out;
  EXPECT_NE(as_admin.out.find("rolls back to step 5"), std::string::npos)
      << as_admin.out;
  // Reading the cluster needs only a valid certificate.
  CommandResult cluster = Ctl("n2", "cluster");
  EXPECT_EQ(cluster.exit_code, 0) << cluster.out;
}

// RelayBatch only from a --relay-identities certificate: a node's own
// certificate is refused naming it, and nothing of the refused batches is
// heard (the node they carry dies); the relay's batch is applied, each
// item as its direct call (a dead node's epoch refused in its item).
TEST_F(TlsTest, RelayBatchNeedsARelayIdentityAndARefusedBatchIsNotHeard) {
  cv1::RegisterNodeResponse reg;
  ASSERT_TRUE(Register(Stub("n1").get(), "n1", &reg).ok());
  cv1::RelayBatchRequest batch;
  batch.set_relay_id("rack-1");
  cv1::HeartbeatRequest* hb = batch.add_heartbeats();
  hb->set_node_id("n1");
  hb->set_epoch(reg.epoch());
  auto node_stub = Stub("n2");
  auto alive = [&] {
    cv1::GetClusterResponse cluster;
    grpc::ClientContext ctx;
    EXPECT_TRUE(
        Stub("n2")->GetCluster(&ctx, cv1::GetClusterRequest(), &cluster).ok());
    for (const auto& n : cluster.nodes())
      if (n.node_id() == "n1") return n.health() == cv1::ALIVE;
    return false;
  };
  // Refused, again and again, at a heartbeat's cadence, until the node the
  // batches carry is declared dead (3 s timeout): they were not heard.
  bool dead = false;
  for (int i = 0; i < 15 && !dead; ++i) {
    cv1::RelayBatchResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = node_stub->RelayBatch(&ctx, batch, &resp);
    ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
    ASSERT_NE(s.error_message().find(
                  "RelayBatch: the client certificate [n2] is not a relay "
                  "identity (--relay-identities: ckpt-relay,rack-2)"),
              std::string::npos)
        << s.error_message();
    dead = Cluster::WaitUntil([&] { return !alive(); }, seconds(1));
  }
  ASSERT_TRUE(dead) << "n1 stayed alive on refused batches";
  // The relay's certificate: applied; n1's epoch is fenced now, as a direct
  // heartbeat of it would be told; n2's heartbeat goes through.
  ASSERT_TRUE(Register(Stub("n2").get(), "n2", &reg).ok());
  cv1::HeartbeatRequest* second = batch.add_heartbeats();
  second->set_node_id("n2");
  second->set_epoch(reg.epoch());
  cv1::RelayBatchResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = Stub("relay")->RelayBatch(&ctx, batch, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.heartbeats_size(), 2);
  EXPECT_EQ(resp.heartbeats(0).status().code(),
            static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION))
      << resp.heartbeats(0).status().message();
  EXPECT_EQ(resp.heartbeats(1).status().code(), 0)
      << resp.heartbeats(1).status().message();
}

TEST_F(TlsTest, CoordinatorRefusesBadRelayIdentitiesNamingTheFlag) {
  const std::string base = std::string(COORDINATOR_BINARY) +
                           " --listen 127.0.0.1:0 --state " + dir_.path() +
                           "/other";
  const std::string tls = " --tls-cert " + Cert("coordinator") + " --tls-key " +
                          Key("coordinator") + " --tls-ca " + Cert("ca");
  struct Case {
    std::string args, names;
  };
  const Case cases[] = {
      {" --insecure --relay-identities ckpt-relay",
       "--relay-identities: only with --tls-cert"},
      {tls + " --relay-identities 'ckpt-relay,rack 2'",
       "--relay-identities: \"rack 2\" is not a certificate identity"},
      {tls + " --relay-identitys ckpt-relay", "--relay-identitys"},
  };
  for (const Case& c : cases) {
    CommandResult r = RunCommand(base + c.args, true, 30);
    EXPECT_EQ(r.exit_code, 2) << c.names << ": " << r.out;
    EXPECT_NE(r.out.find(c.names), std::string::npos)
        << c.names << ": " << r.out;
  }
}

TEST_F(TlsTest, CoordinatorRefusesToStartWithoutTlsOrInsecure) {
  CommandResult r =
      RunCommand(std::string(COORDINATOR_BINARY) +
                 " --listen 127.0.0.1:0 --state " + dir_.path() + "/other");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--insecure"), std::string::npos) << r.out;
}

// The etcd TLS files go together, only with --state etcd://, and must be
// PEM: each mistake stops the coordinator before it serves, naming the flag.
TEST_F(TlsTest, CoordinatorRefusesBadEtcdTlsFlagsNamingTheFlag) {
  const std::string base =
      std::string(COORDINATOR_BINARY) + " --listen 127.0.0.1:0 --insecure";
  const std::string etcd =
      " --state etcd://127.0.0.1:1/p --shared-root " + dir_.path() + "/s";
  struct Case {
    std::string args, names;
  };
  const Case cases[] = {
      {" --state " + dir_.path() + "/other --etcd-tls-ca " + Cert("ca"),
       "only with --state etcd://"},
      {etcd + " --etcd-tls-ca " + Cert("ca"), "--etcd-tls-cert: required"},
      {etcd + " --etcd-tls-ca " + Cert("ca") + " --etcd-tls-cert " +
           Cert("coordinator"),
       "--etcd-tls-key: required"},
      {etcd + " --etcd-tls-ca " + Cert("ca") + " --etcd-tls-cert " +
           Cert("coordinator") + " --etcd-tls-key " + dir_.path() +
           "/missing.key",
       "--etcd-tls-key \"" + dir_.path() + "/missing.key\": cannot be read"},
  };
  for (const Case& c : cases) {
    CommandResult r = RunCommand(base + c.args, true, 30);
    EXPECT_EQ(r.exit_code, 2) << c.names << ": " << r.out;
    EXPECT_NE(r.out.find(c.names), std::string::npos)
        << c.names << ": " << r.out;
  }
}

// A relay (ckpt-relay) under mutual TLS authorizes each node call as the
// coordinator does: a node certificate speaks only for its own node id.
TEST_F(TlsTest, RelayRefusesANodeCertificateSpeakingForAnotherNode) {
  const std::string at = StartRelay("relay");
  ASSERT_FALSE(at.empty());
  auto stub = RelayStub(at, "n2");
  cv1::HeartbeatRequest hb;
  hb.set_node_id("n1");
  hb.set_epoch(1);
  cv1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  grpc::Status s = stub->Heartbeat(&ctx, hb, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  EXPECT_NE(s.error_message().find(
                "node_id \"n1\": the client certificate is for [n2"),
            std::string::npos)
      << s.error_message();
  // The relay's own refusal: the coordinator never saw it.
  EXPECT_EQ(ctx.GetServerTrailingMetadata().count("ckpt-relay-failed"), 0u);
  cv1::ReportShardsRequest reports;
  reports.set_node_id("n1");
  reports.set_epoch(1);
  cv1::ReportShardsResponse reports_resp;
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + seconds(10));
  s = stub->ReportShards(&ctx2, reports, &reports_resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  EXPECT_NE(s.error_message().find("node_id"), std::string::npos)
      << s.error_message();
  // Every other method is not the relay's.
  cv1::GetClusterRequest get;
  cv1::GetClusterResponse cluster;
  grpc::ClientContext ctx3;
  ctx3.set_deadline(std::chrono::system_clock::now() + seconds(10));
  EXPECT_EQ(stub->GetCluster(&ctx3, get, &cluster).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// Through a relay whose certificate the coordinator lists in
// --relay-identities, a node heartbeats as itself and gets the
// coordinator's answer; through a relay it does not list, the refusal
// comes back marked ckpt-relay-failed (the node then calls directly).
TEST_F(TlsTest, RelayCarriesANodeOnlyWhenTheCoordinatorListsItsIdentity) {
  cv1::RegisterNodeResponse reg;
  ASSERT_TRUE(Register(Stub("n1").get(), "n1", &reg).ok());
  cv1::HeartbeatRequest hb;
  hb.set_node_id("n1");
  hb.set_epoch(reg.epoch());
  {
    const std::string at = StartRelay("relay");
    ASSERT_FALSE(at.empty());
    cv1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    grpc::Status s = RelayStub(at, "n1")->Heartbeat(&ctx, hb, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.incarnation(), reg.incarnation());
    // A stale epoch is the coordinator's refusal, as a direct call's.
    hb.set_epoch(reg.epoch() + 100);
    grpc::ClientContext ctx2;
    ctx2.set_deadline(std::chrono::system_clock::now() + seconds(10));
    s = RelayStub(at, "n1")->Heartbeat(&ctx2, hb, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << s.error_message();
    EXPECT_EQ(ctx2.GetServerTrailingMetadata().count("ckpt-relay-failed"), 0u);
    hb.set_epoch(reg.epoch());
  }
  // The coordinator's certificate is not a relay identity.
  const std::string at = StartRelay("coordinator");
  ASSERT_FALSE(at.empty());
  cv1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  grpc::Status s = RelayStub(at, "n1")->Heartbeat(&ctx, hb, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << s.error_message();
  EXPECT_NE(s.error_message().find("ckpt-coordinator"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(ctx.GetServerTrailingMetadata().count("ckpt-relay-failed"), 1u);
}

}  // namespace
}  // namespace ckpt::testing
