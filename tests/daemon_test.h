// DaemonTest: a GoogleTest fixture that runs one real ckptd on a temporary
// socket and root for each test, with its own shared-memory prefix, and
// cleans both up. Tests restart it with Restart() after killing it.
#ifndef CKPT_TESTS_DAEMON_TEST_H_
#define CKPT_TESTS_DAEMON_TEST_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ckpt.grpc.pb.h"
#include "tests/harness.h"

namespace ckpt::testing {

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(); }
  void TearDown() override {
    daemon_.reset();
    UnlinkArenas(prefix_);
  }
  // Starts ckptd on the same root and socket (the previous one must have
  // exited).
  void Restart() {
    auto d = DaemonProcess::Start(root(), run_.path(), prefix_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::string root() const { return root_.path() + "/root"; }
  std::unique_ptr<Client> Connect(const std::string& job, int rank = 0,
                                  int world = 1) {
    auto c = Client::Connect(OptionsFor(*daemon_, job, rank, world));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

  TempDir root_, run_;
  std::string prefix_ = UniqueShmPrefix();
  std::unique_ptr<DaemonProcess> daemon_;
};

// DaemonTest with a raw gRPC stub, for tests that send ckptd requests a
// client library would never build.
class RpcDaemonTest : public DaemonTest {
 protected:
  void SetUp() override { Start(); }
  void Start() {
    Restart();
    stub_ = daemon_->Stub();
  }
  grpc::Status Register(const std::string& job, uint32_t rank, uint32_t world,
                        uint64_t slot_bytes,
                        v1::RegisterResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_job(job);
    req.set_rank(rank);
    req.set_world_size(world);
    req.set_slot_bytes(slot_bytes);
    v1::RegisterResponse r;
    return stub_->Register(&ctx, req, resp ? resp : &r);
  }
  grpc::Status BeginSave(const std::string& job, uint64_t step,
                         uint64_t image_bytes, v1::BeginSaveResponse* resp) {
    grpc::ClientContext ctx;
    v1::BeginSaveRequest req;
    req.set_job(job);
    req.set_step(step);
    req.set_image_bytes(image_bytes);
    return stub_->BeginSave(&ctx, req, resp);
  }

  std::unique_ptr<v1::Ckptd::Stub> stub_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_DAEMON_TEST_H_
