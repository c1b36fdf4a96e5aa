// The engine's catalog writes happen outside its state lock (daemon/
// catalog_writer.h): a synced write that takes long (a slow disk) holds up
// only what needs that record, never another rank's RPCs; and a commit
// whose record cannot be written still changes nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>

#include "daemon/catalog.h"
#include "daemon/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "tests/engine_save.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using daemon::Catalog;
using daemon::Engine;
using daemon::PeerCreds;

// Holds the next synced catalog write until Release().
class SyncGate {
 public:
  void Arm() {
    std::lock_guard<std::mutex> l(mu_);
    armed_ = true;
  }
  void BeforeSync() {
    std::unique_lock<std::mutex> l(mu_);
    if (!armed_) return;
    armed_ = false;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return released_; });
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(30), [&] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, entered_ = false, released_ = false;
};

class EngineCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/root";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    auto cat = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    catalog_->SetBeforeSyncForTesting([this] { gate_.BeforeSync(); });
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.retain_steps = 0;
    auto e = Engine::Open(eo, local_.get(), catalog_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    gate_.Release();
    engine_.reset();
    catalog_.reset();
    UnlinkArenas(prefix_);
  }
  absl::Status Save(uint32_t rank, uint64_t step, bool block = true) {
    return SaveOneTensorStep(engine_.get(), peer_,
                             {.job = "cat",
                              .step = step,
                              .block = block,
                              .rank = rank,
                              .world_size = 2},
                             &arenas_[rank]);
  }
  absl::Status WaitDurable(uint32_t rank, uint64_t step) {
    v1::WaitDurableRequest w;
    w.set_job("cat");
    w.set_rank(rank);
    w.set_step(step);
    w.set_timeout_ms(20000);
    return engine_->WaitDurable(peer_, w);
  }

  TempDir dir_;
  const std::string prefix_ = UniqueShmPrefix();
  const PeerCreds peer_{getpid(), getuid(), getgid()};
  SyncGate gate_;
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arenas_[2];
};

// Design problem 2 of the review: the persister's synced record of a
// durable shard ran under the engine's one mutex, so a slow fsync stalled
// every RPC on the node. Here rank 0's record is held in its fsync while
// rank 1 begins a save and a trainer asks for the latest step.
TEST_F(EngineCatalogTest, SyncedRecordInFlightBlocksNoOtherRanksRpc) {
  ASSERT_TRUE(Save(0, 1).ok());
  ASSERT_TRUE(Save(1, 1).ok());
  ASSERT_TRUE(WaitDurable(0, 1).ok());
  ASSERT_TRUE(WaitDurable(1, 1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));

  gate_.Arm();
  ASSERT_TRUE(Save(0, 2).ok());  // its durable record is synced next
  ASSERT_TRUE(gate_.WaitEntered()) << "no synced write after the persist";

  auto others = std::async(std::launch::async, [&]() -> absl::Status {
    v1::LatestRequest lr;
    lr.set_job("cat");
    auto latest = engine_->Latest(peer_, lr);
    if (!latest.ok()) return latest.status();
    if (!latest->found() || latest->step() != 1)
      return absl::InternalError("Latest is not step 1");
    v1::BeginSaveRequest br;
    br.set_job("cat");
    br.set_rank(1);
    br.set_step(2);
    br.set_image_bytes(8 << 10);
    auto begin = engine_->BeginSave(peer_, br);
    if (!begin.ok()) return begin.status();
    v1::AbortSaveRequest ar;
    ar.set_job("cat");
    ar.set_rank(1);
    ar.set_lease(begin->lease());
    return engine_->AbortSave(peer_, ar);
  });
  // Not a timing assertion: the RPCs need no record, so they finish while
  // the sync is held; 20 s only bounds the failure on a daemon that waits.
  const bool finished =
      others.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "Latest/BeginSave of rank 1 waited for rank 0's "
                           "catalog sync";
  gate_.Release();
  absl::Status s = others.get();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(WaitDurable(0, 2).ok());
}

// The commit's record is written outside the lock, but a commit whose
// record cannot be written is still refused and leaves nothing behind:
// the step is not listed, no report of it stays, and its slot is free.
TEST_F(EngineCatalogTest, CommitWhoseRecordCannotBeWrittenLeavesNoStep) {
  ASSERT_TRUE(Save(0, 1).ok());
  ASSERT_TRUE(WaitDurable(0, 1).ok());
  catalog_->FailPutsForTesting(/*shards=*/true, /*jobs=*/false);
  absl::Status s = Save(0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  catalog_->FailPutsForTesting(false, false);
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));
  v1::ListRequest lr;
  lr.set_job("cat");
  auto list = engine_->List(peer_, lr);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->jobs_size(), 1);
  for (const auto& step : list->jobs(0).steps())
    EXPECT_NE(step.step(), 2u) << "a refused commit left its step";
  // Both slots are usable again: two more saves find a slot without
  // waiting.
  s = Save(0, 3, /*block=*/false);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(WaitDurable(0, 3).ok());
  s = Save(0, 4, /*block=*/false);
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace ckpt::testing
