// Bad input to the Coordinator: each is refused with an error naming the
// field, and the state (checked before and after) does not change.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include <fstream>
#include <functional>
#include <random>

#include "coordinator/coordinator_testing.h"
#include "coordinator/options.h"
#include "coordinator/service.h"
#include "storage/manifest.h"
#include "tests/raw_grpc_call.h"

namespace ckpt::coordinator {
namespace {

class BadInputTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    e1_ = Register("n1", 1);
    e2_ = Register("n2", 1);
    RegisterJob("job", 2);
  }
  void MakeDurable(uint64_t step) {
    for (auto state : {v1::STAGED, v1::DURABLE}) {
      ASSERT_TRUE(Report("n1", e1_, step, 0, state).ok());
      ASSERT_TRUE(Report("n2", e2_, step, 1, state).ok());
    }
  }
  std::string State() {
    v1::GetClusterResponse c = coord_->GetCluster();
    for (auto& n : *c.mutable_nodes()) n.clear_ms_since_heartbeat();
    return c.SerializeAsString();
  }
  uint64_t e1_ = 0, e2_ = 0;
};

TEST_F(BadInputTest, StaleEpochReportIsRejectedAndChangesNothing) {
  now_ms_ += 4000;
  ASSERT_TRUE(coord_->Tick().ok());  // both dead
  uint64_t fresh = Register("n1", 1);
  ASSERT_GT(fresh, e1_);
  std::string before = State();
  auto r = Report("n1", e1_, 7, 0, v1::STAGED);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("epoch: " + std::to_string(e1_)),
            absl::string_view::npos)
      << r.status();
  EXPECT_EQ(Heartbeat("n1", e1_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(State(), before);
}

TEST_F(BadInputTest, SecondRegistrationOfAliveNodeIsAlreadyExists) {
  v1::RegisterNodeRequest req;
  req.set_node_id("n1");
  req.set_capacity(1);
  std::string before = State();
  auto r = coord_->RegisterNode(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(r.status().message().find("node_id"), absl::string_view::npos);
  EXPECT_EQ(State(), before);
}

TEST_F(BadInputTest, UnknownNodeAndMalformedRegistrationAreRejected) {
  EXPECT_EQ(Report("ghost", 1, 1, 0, v1::STAGED).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Heartbeat("ghost", 1).status().code(), absl::StatusCode::kNotFound);
  v1::RegisterNodeRequest req;
  req.set_node_id("../etc");
  req.set_capacity(1);
  EXPECT_EQ(coord_->RegisterNode(req).status().code(),
            absl::StatusCode::kInvalidArgument);
  req.set_node_id("n3");
  req.set_capacity(0);
  auto r = coord_->RegisterNode(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("capacity"), absl::string_view::npos);
}

TEST_F(BadInputTest, ReportForRankTheNodeDoesNotHostIsRejected) {
  std::string before = State();
  auto r = Report("n1", e1_, 5, 1, v1::STAGED);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("rank: 1"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(Report("n1", e1_, 5, 9, v1::STAGED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Report("n1", e1_, 5, 0, v1::STAGED, "nojob").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(State(), before);
}

TEST_F(BadInputTest, DurableReportOfStepNeverStagedIsRejected) {
  std::string before = State();
  auto r = Report("n1", e1_, 5, 0, v1::DURABLE);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("never staged"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(State(), before);
}

TEST_F(BadInputTest, DurableReportWithOtherSizeOrUnsafeKeyIsRejected) {
  ASSERT_TRUE(Report("n1", e1_, 5, 0, v1::STAGED).ok());
  v1::ReportShardRequest req;
  req.set_node_id("n1");
  req.set_epoch(e1_);
  req.set_job("job");
  req.set_step(5);
  req.set_rank(0);
  req.set_state(v1::DURABLE);
  req.set_bytes(1);
  req.set_checksum_digest(0xabc0);
  req.set_key("job/x");
  auto r = coord_->ReportShard(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("bytes"), absl::string_view::npos)
      << r.status();
  req.set_bytes(1000);
  req.set_key("../../etc/passwd");
  r = coord_->ReportShard(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("key"), absl::string_view::npos)
      << r.status();
  req.set_state(v1::SHARD_STATE_UNSPECIFIED);
  EXPECT_EQ(coord_->ReportShard(req).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(BadInputTest, RollbackToStepNotDurableEverywhereIsRejected) {
  MakeDurable(4);
  ASSERT_TRUE(Report("n1", e1_, 6, 0, v1::STAGED).ok());
  ASSERT_TRUE(Report("n1", e1_, 6, 0, v1::DURABLE).ok());  // rank 1 missing
  std::string before = State();
  v1::RollbackRequest req;
  req.set_job("job");
  req.set_step(6);
  auto r = coord_->Rollback(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("step: 6"), absl::string_view::npos)
      << r.status();
  EXPECT_EQ(State(), before);
  req.set_step(4);
  auto ok = coord_->Rollback(req);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(HasEvent(v1::ROLLBACK));
  auto hb = Heartbeat("n1", e1_);
  ASSERT_TRUE(hb.ok());
  ASSERT_GE(hb->orders_size(), 1);
  EXPECT_EQ(hb->orders(hb->orders_size() - 1).kind(), v1::RESTART);
  EXPECT_EQ(hb->orders(hb->orders_size() - 1).step(), 4u);
}

TEST_F(BadInputTest, ManifestThatDoesNotParseIsRefusedOnRollbackAndReopen) {
  MakeDurable(4);
  MakeDurable(8);
  std::string path =
      dir_.path() + "/shared/" + storage::GlobalManifestKey("job", 8);
  std::ofstream(path, std::ios::trunc) << "{\"format\": not json";
  v1::RollbackRequest req;
  req.set_job("job");
  req.set_step(8);
  auto r = coord_->Rollback(req);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("MANIFEST.global"),
            absl::string_view::npos)
      << r.status();
  Reopen();
  EXPECT_TRUE(HasEvent(v1::MANIFEST_INVALID));
  EXPECT_EQ(Job().last_good_step(), 4u);  // falls back to the readable manifest
}

// Refusals name the field and quote at most a prefix of what they refuse.
void ExpectRefused(const absl::Status& s, const std::string& field) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
      << field << ": " << s.message().substr(0, 200);
  EXPECT_NE(s.message().find(field), absl::string_view::npos)
      << s.message().substr(0, 200);
  EXPECT_LT(s.message().size(), 1024u) << field;
}

TEST_F(BadInputTest, HugeOrNonAsciiNamesAreRefusedFirstAndChangeNothing) {
  std::string before = State();
  const std::string huge(1 << 20, 'n');
  v1::RegisterNodeRequest node;
  node.set_node_id(huge);
  node.set_capacity(1);
  ExpectRefused(coord_->RegisterNode(node).status(), "node_id");
  node.set_node_id("n3");
  node.set_address("host\xff\xfe:1");
  ExpectRefused(coord_->RegisterNode(node).status(), "address");
  node.set_address(huge);
  ExpectRefused(coord_->RegisterNode(node).status(), "address");
  ExpectRefused(Heartbeat(huge, e1_).status(), "node_id");
  ExpectRefused(Report(huge, e1_, 5, 0, v1::STAGED).status(), "node_id");
  ExpectRefused(Report("n1", e1_, 5, 0, v1::STAGED, "j\xc3(").status(), "job");
  ExpectRefused(Report("n1", e1_, 5, 0, v1::STAGED, huge).status(), "job");
  v1::ReportShardRequest shard;
  shard.set_node_id("n1");
  shard.set_epoch(e1_);
  shard.set_job("job");
  shard.set_state(v1::DURABLE);
  for (const std::string& key :
       {huge, std::string("job/a\0b", 7), "/" + std::string(900, 'k'),
        "job/../" + std::string(900, 'k')}) {
    shard.set_key(key);
    ExpectRefused(coord_->ReportShard(shard).status(), "key");
  }
  shard.set_state(v1::STAGED);  // a key is checked whenever one is given
  ExpectRefused(coord_->ReportShard(shard).status(), "key");
  v1::ReportTrainerExitRequest exit;
  exit.set_node_id("n1");
  exit.set_epoch(e1_);
  exit.set_job(huge);
  exit.set_exit_code(1);
  ExpectRefused(coord_->ReportTrainerExit(exit).status(), "job");
  v1::RollbackRequest rollback;
  rollback.set_job(huge);
  ExpectRefused(coord_->Rollback(rollback).status(), "job");
  EXPECT_EQ(State(), before);
}

// The gRPC service in front of a coordinator: request bodies that do not
// parse are INVALID_ARGUMENT naming the field, never INTERNAL.
class HostileRpcTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    CoordinatorOptions o;
    o.state_dir = dir_.path() + "/served-state";
    o.shared_root = dir_.path() + "/served-shared";
    auto c = Coordinator::Open(o);
    ASSERT_TRUE(c.ok()) << c.status();
    auto server = CoordinatorServer::Start(std::move(*c), "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  grpc::Status RawCall(const std::string& method, const std::string& body) {
    return ckpt::testing::RawUnaryCall(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                            grpc::InsecureChannelCredentials()),
        "/ckpt.coord.v1.Coordinator/" + method, body, std::chrono::seconds(30));
  }
  std::unique_ptr<CoordinatorServer> server_;
};

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

TEST_F(HostileRpcTest, RequestsThatDoNotParseAreInvalidArgumentNamingTheField) {
  v1::RegisterNodeRequest node;
  node.set_node_id("a-node-with-a-long-name");
  node.set_capacity(1);
  std::string body = node.SerializeAsString();
  ExpectRefused(FromGrpc(RawCall("RegisterNode", body.substr(0, 8))),
                "node_id: truncated");
  ExpectRefused(FromGrpc(RawCall("Heartbeat", std::string("\x0c", 1))),
                "node_id");
  ExpectRefused(FromGrpc(RawCall("GetCluster", std::string(12, '\xff'))),
                "request");
  v1::RelayBatchRequest relay;  // a relay's batch: the item's field named
  relay.set_relay_id("rack-1");
  relay.add_heartbeats()->set_node_id("a-node-with-a-long-name");
  body = relay.SerializeAsString();
  ExpectRefused(
      FromGrpc(RawCall("RelayBatch", body.substr(0, body.size() - 4))),
      "heartbeats");
  node.set_node_id("\xff\xfe");
  ExpectRefused(FromGrpc(RawCall("RegisterNode", node.SerializeAsString())),
                "node_id");
  std::mt19937 rng(8);
  for (const char* method :
       {"RegisterNode", "Heartbeat", "RegisterJob", "ReportShard",
        "ReportTrainerExit", "Rollback", "Resume", "Events"}) {
    for (int i = 0; i < 20; ++i) {
      std::string random(1 + rng() % 100, '\0');
      for (char& c : random) c = static_cast<char>(rng());
      grpc::Status s = RawCall(method, random);
      EXPECT_NE(s.error_code(), grpc::StatusCode::INTERNAL)
          << method << ": " << s.error_message();
      EXPECT_NE(s.error_code(), grpc::StatusCode::UNKNOWN)
          << method << ": " << s.error_message();
      if (!s.ok()) {
        EXPECT_FALSE(s.error_message().empty()) << method;
        EXPECT_LT(s.error_message().size(), 1024u) << method;
      }
    }
  }
  for (int i = 0; i < 20; ++i) {  // a relay's batch likewise
    std::string random(1 + rng() % 100, '\0');
    for (char& c : random) c = static_cast<char>(rng());
    grpc::Status s = RawCall("RelayBatch", random);
    EXPECT_NE(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
    EXPECT_NE(s.error_code(), grpc::StatusCode::UNKNOWN) << s.error_message();
    if (!s.ok()) {
      EXPECT_FALSE(s.error_message().empty());
      EXPECT_LT(s.error_message().size(), 1024u);
    }
  }
  // Still serving a well-formed call.
  EXPECT_TRUE(RawCall("GetCluster", "").ok());
}

TEST(ManifestTest, DecodeNamesTheFieldThatIsWrong) {
  storage::v1::GlobalManifest m;
  m.set_format(storage::kGlobalManifestFormat);
  m.set_job("j");
  m.set_step(3);
  m.set_world_size(2);
  for (uint32_t r = 0; r < 2; ++r) {
    auto* s = m.add_shards();
    s->set_rank(r);
    s->set_key("j/k" + std::to_string(r));
    s->set_checksum_digest(storage::DigestHex(r));
  }
  std::string json = storage::EncodeGlobalManifest(m);
  ASSERT_TRUE(storage::DecodeGlobalManifest(json, "k", "j", 3).ok());
  auto expect_error = [&](storage::v1::GlobalManifest bad,
                          const std::string& field) {
    auto d = storage::DecodeGlobalManifest(storage::EncodeGlobalManifest(bad),
                                           "k", "j", 3);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << field;
    EXPECT_NE(d.status().message().find(field), absl::string_view::npos)
        << d.status();
  };
  storage::v1::GlobalManifest bad = m;
  bad.set_step(4);
  expect_error(bad, "step");
  bad = m;
  bad.mutable_shards(1)->set_rank(0);
  expect_error(bad, "shards.rank");
  bad = m;
  bad.mutable_shards(0)->set_checksum_digest("xyz");
  expect_error(bad, "checksum_digest");
  bad = m;
  bad.mutable_shards()->RemoveLast();
  expect_error(bad, "shards");
  EXPECT_EQ(storage::DecodeGlobalManifest("[]", "k", "j", 3).status().code(),
            absl::StatusCode::kDataLoss);
}

// A fallback report is a node RPC like the others: a fenced epoch, an
// unknown job, a rank the node does not host or a malformed field is
// refused naming the field, and nothing is recorded.
TEST_F(BadInputTest,
       FallbackOfStaleEpochUnknownJobOrRankNotHostedIsRefusedRecordingNothing) {
  auto fallback = [&](auto edit) {
    v1::ReportFallbackRequest req;
    req.set_node_id("n1");
    req.set_epoch(e1_);
    req.set_job("job");
    req.set_step(40);
    req.set_rank(0);
    req.set_copy("memory");
    req.set_reason("checksum mismatch");
    req.set_next_copy("file");
    edit(req);
    return coord_->ReportFallback(req).status();
  };
  const std::string before = State();
  struct Case {
    std::string field;
    std::function<void(v1::ReportFallbackRequest&)> edit;
  };
  const std::vector<Case> cases = {
      {"epoch", [&](auto& r) { r.set_epoch(e1_ + 7); }},
      {"node_id", [](auto& r) { r.set_node_id("n9"); }},
      {"job", [](auto& r) { r.set_job("other"); }},
      {"job", [](auto& r) { r.set_job(std::string(300, 'j')); }},
      {"rank", [](auto& r) { r.set_rank(1); }},  // n2's
      {"rank", [](auto& r) { r.set_rank(5); }},
      {"copy", [](auto& r) { r.set_copy("disk"); }},
      {"copy", [](auto& r) { r.set_copy(""); }},
      {"reason", [](auto& r) { r.set_reason(std::string(4096, 'x')); }},
      {"reason", [](auto& r) { r.set_reason("bad\nline"); }},
      {"next_step", [](auto& r) { r.set_next_step(40); }},
      {"next_copy", [](auto& r) { r.set_next_copy("tape"); }},
  };
  for (const Case& c : cases) {
    absl::Status s = fallback(c.edit);
    EXPECT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.message().rfind(c.field + ":", 0), 0u) << c.field << ": " << s;
    EXPECT_LE(s.message().size(), 400u)
        << "a bad value is quoted by its prefix: " << s;
  }
  EXPECT_FALSE(HasEvent(v1::FALLBACK));
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(fallback([](auto&) {}).ok()) << "the unedited report is good";
  EXPECT_TRUE(HasEvent(v1::FALLBACK));
}

// ckpt-coordinator's command line (plus `extra`), parsed.
absl::StatusOr<CoordinatorServerOptions> ParseArgs(
    std::vector<std::string> extra, std::string* help = nullptr) {
  std::vector<std::string> args = {"ckpt-coordinator",   "--listen",
                                   "127.0.0.1:0",        "--state",
                                   "/nonexistent/state", "--insecure"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::string ignored;
  return ParseCoordinatorOptions(static_cast<int>(argv.size()), argv.data(),
                                 help ? help : &ignored);
}

TEST(CoordinatorOptionsTest,
     PlanAckTimeoutAndMaxSoftStepsComeFromFlagsOrTheConfigFile) {
  auto o = ParseArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.plan_ack_timeout, std::chrono::minutes(10))
      << "the default";
  EXPECT_EQ(o->coordinator.max_soft_steps, 64u) << "the default";

  o = ParseArgs({"--plan-ack-timeout-ms", "120000", "--max-soft-steps", "16"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.plan_ack_timeout, std::chrono::milliseconds(120000));
  EXPECT_EQ(o->coordinator.max_soft_steps, 16u);

  ckpt::testing::TempDir dir;
  const std::string config = dir.path() + "/coordinator.toml";
  std::ofstream(config) << "plan_ack_timeout_ms = 0\nmax_soft_steps = 8\n";
  o = ParseArgs({"--config", config});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.plan_ack_timeout, std::chrono::milliseconds(0))
      << "0: no deadline";
  EXPECT_EQ(o->coordinator.max_soft_steps, 8u);
  o = ParseArgs({"--config", config, "--max-soft-steps", "32"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.max_soft_steps, 32u)
      << "the flag wins over the file";

  std::string help;
  EXPECT_EQ(ParseArgs({"--help"}, &help).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_NE(help.find("--plan-ack-timeout-ms"), std::string::npos) << help;
  EXPECT_NE(help.find("--max-soft-steps"), std::string::npos) << help;
}

TEST(CoordinatorOptionsTest,
     BadPlanAckTimeoutOrMaxSoftStepsIsAnErrorNamingTheFlagOrKey) {
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--plan-ack-timeout-ms", "10"},
        {"--plan-ack-timeout-ms", "-1"},
        {"--plan-ack-timeout-ms", "soon"},
        {"--plan-ack-timeout-ms", "999999999999"}}) {
    auto o = ParseArgs(bad);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << bad[1];
    EXPECT_NE(o.status().message().find("--plan-ack-timeout-ms"),
              std::string::npos)
        << o.status();
  }
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--max-soft-steps", "0"},
        {"--max-soft-steps", "-3"},
        {"--max-soft-steps", "many"},
        {"--max-soft-steps", "100000000"}}) {
    auto o = ParseArgs(bad);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << bad[1];
    EXPECT_NE(o.status().message().find("--max-soft-steps"), std::string::npos)
        << o.status();
  }
  ckpt::testing::TempDir dir;
  const std::string config = dir.path() + "/coordinator.toml";
  for (const auto& [line, key] :
       std::vector<std::pair<std::string, std::string>>{
           {"plan_ack_timeout_ms = 5", "plan_ack_timeout_ms"},
           {"plan_ack_timeout_ms = \"10m\"", "plan_ack_timeout_ms"},
           {"max_soft_steps = 0", "max_soft_steps"}}) {
    std::ofstream(config, std::ios::trunc) << line << "\n";
    auto o = ParseArgs({"--config", config});
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << line;
    EXPECT_NE(o.status().message().find(key), std::string::npos) << o.status();
  }
}

TEST(CoordinatorOptionsTest, MaxFailedPlansIsSetOrRefusedNamingTheFlagOrKey) {
  auto o = ParseArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.max_failed_plans, 10u) << "the default";
  o = ParseArgs({"--max-failed-plans", "0"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.max_failed_plans, 0u) << "0: no limit";
  o = ParseArgs({"--max-failed-plans", "3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.max_failed_plans, 3u);
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--max-failed-plans", "-1"},
        {"--max-failed-plans", "often"},
        {"--max-failed-plans", "1000001"},
        {"--max-failed-plans", "99999999999"}}) {
    auto r = ParseArgs(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad[1];
    EXPECT_NE(r.status().message().find("--max-failed-plans"),
              std::string::npos)
        << r.status();
  }
  ckpt::testing::TempDir dir;
  const std::string config = dir.path() + "/coordinator.toml";
  std::ofstream(config) << "max_failed_plans = -2\n";
  auto r = ParseArgs({"--config", config});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("max_failed_plans"), std::string::npos)
      << r.status();
  std::string help;
  EXPECT_EQ(ParseArgs({"--help"}, &help).status().code(),
            absl::StatusCode::kCancelled);
  EXPECT_NE(help.find("--max-failed-plans"), std::string::npos) << help;
}

TEST(CoordinatorOptionsTest, StragglerWindowIsSetOrRefusedNamingTheFlag) {
  auto o = ParseArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.hang.straggler_window_s, 10);
  o = ParseArgs({"--straggler-window-s", "2.5", "--straggler-windows", "2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.hang.straggler_window_s, 2.5);
  EXPECT_EQ(o->coordinator.hang.straggler_windows, 2);
  for (const char* bad : {"0", "0.5", "-1", "soon", "3601"}) {
    auto r = ParseArgs({"--straggler-window-s", bad});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--straggler-window-s"),
              std::string::npos)
        << r.status();
  }
}

TEST(CoordinatorOptionsTest, ElasticFlagsAreParsedAndBadOnesNamed) {
  auto o = ParseArgs({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.min_world_size, 0u) << "the default: no shrink";
  EXPECT_EQ(o->coordinator.world_size_multiple, 1u);
  EXPECT_EQ(o->coordinator.spare_wait_ms, 0) << "the default: at once";
  o = ParseArgs({"--min-world-size", "4", "--world-size-multiple", "2",
                 "--spare-wait-s", "1.5"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.min_world_size, 4u);
  EXPECT_EQ(o->coordinator.world_size_multiple, 2u);
  EXPECT_EQ(o->coordinator.spare_wait_ms, 1500);
  for (const auto& [bad, flag] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--min-world-size", "3", "--world-size-multiple", "2"},
            "--min-world-size"},
           {{"--world-size-multiple", "0"}, "--world-size-multiple"},
           {{"--spare-wait-s", "-1"}, "--spare-wait-s"},
           {{"--min-world-size", "many"}, "--min-world-size"}}) {
    auto r = ParseArgs(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad[1];
    EXPECT_NE(r.status().message().find(flag), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace ckpt::coordinator
