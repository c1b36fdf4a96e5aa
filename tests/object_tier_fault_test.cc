// The object tier under faults, with a real ckptd and a real S3 server
// (s3rver) behind the fault proxy (tests/s3_server.h): a store that fails
// every PUT for a while, and a job owner who damages a shard file the
// daemon must upload from. The daemon keeps serving; the upload fails
// cleanly, naming the file.
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "storage/keys.h"
#include "storage/manifest.h"
#include "tests/daemon_test.h"
#include "tests/s3_server.h"

namespace ckpt::testing {
namespace {

using std::chrono::seconds;
using std::chrono::steady_clock;

class ObjectTierFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = S3Server::Unavailable(); !why.empty())
      GTEST_SKIP() << why;
    s3_ = std::make_unique<S3Server>();
    ASSERT_TRUE(s3_->ok());
    proxy_ = std::make_unique<FaultProxy>(*s3_);
    ASSERT_TRUE(proxy_->ok());
    // The daemon reaches the store through the proxy.
    ExportS3Environment(proxy_->endpoint());
    // A failing request gives up quickly, so the uploader's own retries
    // (and their errors in Status) come soon.
    config_ = dir_.path() + "/ckptd.toml";
    std::ofstream(config_) << "object_max_attempts = 2\n"
                              "object_retry_budget_ms = 2000\n";
    auto b = storage::NewObjectBackend(s3_->Options("tier"));
    ASSERT_TRUE(b.ok()) << b.status();
    objects_ = std::move(*b);  // straight to the store, not through the proxy
  }
  void TearDown() override {
    daemon_.reset();
    UnlinkArenas(prefix_);
  }
  // Starts ckptd (again) with `extra` flags after the common ones.
  void Start(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {
        "--config",     config_,
        "--object-url", std::string("s3://") + kS3Bucket + "/tier",
        "--retain",     "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto d = DaemonProcess::Start(root(), dir_.path(), prefix_, args);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  bool InStore(const std::string& key) { return objects_->Stat(key).ok(); }
  // Whether pred holds within 60 s (for what a bug would never do).
  template <typename Pred>
  bool Within60s(Pred pred) {
    const auto deadline = steady_clock::now() + seconds(60);
    while (!pred()) {
      if (steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }
  std::string root() const { return dir_.path() + "/root"; }
  std::unique_ptr<Client> Connect(const std::string& job) {
    auto c = Client::Connect(OptionsFor(*daemon_, job, 0, 1));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Fails the test if the daemon has died (and says how).
  bool Alive() {
    if (!daemon_->running()) return false;  // its death is reported already
    int status = 0;
    if (!daemon_->Exited(&status)) return true;
    ADD_FAILURE() << "ckptd died: "
                  << (WIFSIGNALED(status)
                          ? "signal " + std::to_string(WTERMSIG(status))
                          : "exit " + std::to_string(WEXITSTATUS(status)));
    return false;
  }
  // Polls Status until pred holds (true), the daemon dies or 90 s pass.
  template <typename Pred>
  bool StatusUntil(Pred pred) {
    const auto deadline = steady_clock::now() + seconds(90);
    while (steady_clock::now() < deadline && Alive()) {
      grpc::ClientContext ctx;
      v1::StatusResponse st;
      if (daemon_->Stub()->Status(&ctx, v1::StatusRequest(), &st).ok() &&
          pred(st))
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  TempDir dir_;
  std::string config_;
  std::unique_ptr<S3Server> s3_;
  std::unique_ptr<FaultProxy> proxy_;
  std::unique_ptr<storage::Backend> objects_;
  std::string prefix_ = UniqueShmPrefix();
  std::unique_ptr<DaemonProcess> daemon_;
  HostState state_ = MakeState(6 << 20, 3, 5);
};

// A job owner truncates the file of a step whose upload is pending and
// whose slot was reused: the upload must come from that file. Reading it
// through a mapping would kill the daemon with SIGBUS, and again after each
// restart (recovery queues the upload again).
TEST_F(ObjectTierFaultTest, TruncatedShardFileFailsItsUploadNotTheDaemon) {
  Start();
  auto client = Connect("trunc");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(
      proxy_->Fault("kind=status&status=503&code=SlowDown&count=100000&"
                    "match=PUT"));
  // Two slots, three saves: step 3 takes step 1's slot, so step 1 can only
  // be uploaded from its local file.
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(client->Save(step, state_.tensors).ok()) << step;
    ASSERT_TRUE(client->WaitDurable(step).ok()) << step;  // local tier
  }
  const std::string file = root() + "/" + storage::ShardKey("trunc", 1, 0);
  ASSERT_EQ(truncate(file.c_str(), 4096), 0) << file;
  proxy_->Reset();  // the store answers again

  auto names_file = [&](const v1::StatusResponse& st) {
    return st.last_upload_error().find(file) != std::string::npos;
  };
  EXPECT_TRUE(StatusUntil(names_file)) << "no upload error naming " << file;
  // The other steps upload, and the daemon still saves and restores.
  EXPECT_TRUE(StatusUntil(
      [](const v1::StatusResponse& st) { return st.uploaded_shards() >= 2; }));
  ASSERT_TRUE(Alive());
  ASSERT_TRUE(client->Save(4, state_.tensors).ok());
  HostState got = state_.EmptyLike();
  ASSERT_TRUE(client->Restore(4, got.tensors).ok());
  EXPECT_TRUE(got.Equals(state_));
  client.reset();

  // A restart queues step 1's upload again; it fails the same way.
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  Start();
  EXPECT_TRUE(StatusUntil(names_file)) << "no upload error naming " << file;
  EXPECT_TRUE(Alive());
}

// Retention drops step 1 from the object tier while the store refuses
// deletes, and the daemon is then SIGKILLed: the deletes were promised
// (the step is gone from the catalog), so the restarted daemon must carry
// them out; else step 1's manifest and shard stay in the store for ever.
TEST_F(ObjectTierFaultTest, DeletesQueuedBeforeACrashAreDoneAfterRestart) {
  Start({"--retain-object", "1"});
  const std::string manifest1 = storage::ManifestKey("gone", 1);
  const std::string shard1 = storage::ShardKey("gone", 1, 0);
  auto client = Connect("gone");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Save(1, state_.tensors).ok());
  ASSERT_TRUE(Within60s([&] { return InStore(manifest1); }));
  const long kRefusals = 100000;
  ASSERT_TRUE(proxy_->Fault("kind=status&status=503&code=SlowDown&count=" +
                            std::to_string(kRefusals) + "&match=DELETE"));
  ASSERT_TRUE(client->Save(2, state_.tensors).ok());
  ASSERT_TRUE(Within60s([&] {
    return InStore(storage::ManifestKey("gone", 2)) &&
           proxy_->Stat("faults_left") < kRefusals;
  })) << "retention never tried to delete step 1";
  client.reset();
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  EXPECT_TRUE(InStore(manifest1));  // the store refused its delete
  proxy_->Reset();
  Start({"--retain-object", "1"});
  EXPECT_TRUE(Within60s([&] { return !InStore(manifest1); }))
      << manifest1 << " stays visible after the daemon deleted the step";
  EXPECT_TRUE(Within60s([&] { return !InStore(shard1); }));
  EXPECT_TRUE(InStore(storage::ManifestKey("gone", 2)));
}

}  // namespace
}  // namespace ckpt::testing
