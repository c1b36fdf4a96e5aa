// The engine's catalog writes happen outside its state lock (daemon/
// catalog_writer.h): a synced write that takes long (a slow disk) holds up
// only what needs that record, never another rank's RPCs; and a commit
// whose record cannot be written still changes nothing. An arena's creation
// (which waits for its job record) and its drop (unregister, unlink, unmap;
// daemon/pipeline/arena_drops.h) hold up no other rank's or job's RPCs either.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "tests/engine_save.h"
#include "tests/gated_backend.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using daemon::Catalog;
using daemon::Engine;
using daemon::PeerCreds;
namespace catv1 = ::ckpt::catalog::v1;

// Holds the next synced catalog write (with `any`, the next write) until
// Release().
class SyncGate {
 public:
  void Arm(bool any = false) {
    std::lock_guard<std::mutex> l(mu_);
    armed_ = true;
    any_ = any;
  }
  void BeforeWrite(bool sync) {
    std::unique_lock<std::mutex> l(mu_);
    if (!armed_ || !(sync || any_)) return;
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
  bool armed_ = false, any_ = false, entered_ = false, released_ = false;
};

// A catalog whose shard puts all fail, and a writer over it held inside a
// write that succeeds, so that the edits enqueued next are written as one
// group when the test releases the gate.
class CatalogWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cat = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    cat_ = std::move(*cat);
    cat_->SetBeforeWriteForTesting(
        [this](bool sync) { gate_.BeforeWrite(sync); });
    cat_->FailPutsForTesting(/*shards=*/true, /*jobs=*/false);
    writer_ = std::make_unique<daemon::CatalogWriter>(cat_.get());
    gate_.Arm(/*any=*/true);
    job_.set_job("w");
    daemon::CatalogEdit hold;
    hold.PutJob(job_);
    held_ = writer_->Enqueue(std::move(hold), /*sync=*/false);
    ASSERT_TRUE(gate_.WaitEntered());
  }
  void TearDown() override {
    gate_.Release();
    writer_.reset();
    cat_->SetBeforeWriteForTesting(nullptr);
  }
  uint64_t EnqueueShard(uint64_t step, bool sync) {
    catv1::ShardRecord shard;
    shard.set_job("w");
    shard.set_step(step);
    daemon::CatalogEdit edit;
    edit.PutShard(shard);
    return writer_->Enqueue(std::move(edit), sync);
  }
  size_t ToldOk(const std::vector<uint64_t>& tickets) {
    size_t n = 0;
    for (uint64_t t : tickets)
      if (writer_->Wait(t).ok()) ++n;
    return n;
  }

  TempDir dir_;
  std::unique_ptr<Catalog> cat_;
  SyncGate gate_;
  std::unique_ptr<daemon::CatalogWriter> writer_;
  catv1::JobRecord job_;
  uint64_t held_ = 0;
};

// A group with more failing edits than the writer once remembered (a full
// catalog disk while many records queue behind a slow sync): every
// waiter hears its own edit's failure; none is told OK for an edit that
// was never written.
TEST_F(CatalogWriterTest, EveryWaiterOfAFailedEditHearsTheFailure) {
  std::vector<uint64_t> tickets;
  for (uint64_t step = 1; step <= 300; ++step)
    tickets.push_back(EnqueueShard(step, /*sync=*/true));
  gate_.Release();
  EXPECT_TRUE(writer_->Wait(held_).ok());
  EXPECT_EQ(ToldOk(tickets), 0u)
      << "edits that were never written, answered OK";
  EXPECT_EQ(writer_->Wait(tickets.front()).code(),
            absl::StatusCode::kResourceExhausted);
}

// Failures that alternate with successes cannot be kept as one run; past
// what the writer keeps, an old failed edit is still never answered OK.
TEST_F(CatalogWriterTest, FailureOlderThanWhatIsKeptIsNeverAnsweredOk) {
  std::vector<uint64_t> failing;
  for (uint64_t step = 1; step <= 5000; ++step) {
    failing.push_back(EnqueueShard(step, /*sync=*/false));
    daemon::CatalogEdit ok;
    ok.PutJob(job_);
    (void)writer_->Enqueue(std::move(ok), /*sync=*/false);
  }
  gate_.Release();
  EXPECT_EQ(ToldOk(failing), 0u)
      << "edits that were never written, answered OK";
}

class EngineCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/root";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    gated_ = std::make_unique<GatedBackend>(local_.get());
    auto cat = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    catalog_->SetBeforeWriteForTesting(
        [this](bool sync) { gate_.BeforeWrite(sync); });
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.retain_steps = 0;
    auto e = Engine::Open(eo, gated_.get(), catalog_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    gate_.Release();
    gated_->ReleaseUnregister();
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
  std::unique_ptr<GatedBackend> gated_;  // over local_
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arenas_[2];
};

// Rank 1 of "cat" begins a save and gives it up, and a trainer asks for the
// latest step: RPCs that need nothing of the rank or job held elsewhere.
absl::Status OtherRanksRpcs(Engine* engine, const PeerCreds& peer,
                            uint32_t rank) {
  v1::LatestRequest lr;
  lr.set_job("cat");
  auto latest = engine->Latest(peer, lr);
  if (!latest.ok()) return latest.status();
  v1::BeginSaveRequest br;
  br.set_job("cat");
  br.set_rank(rank);
  br.set_step(2);
  br.set_image_bytes(8 << 10);
  auto begin = engine->BeginSave(peer, br);
  if (!begin.ok()) return begin.status();
  v1::AbortSaveRequest ar;
  ar.set_job("cat");
  ar.set_rank(rank);
  ar.set_lease(begin->lease());
  return engine->AbortSave(peer, ar);
}

// The persister's synced record of a durable shard once ran under the
// engine's one mutex, so a slow fsync stalled every RPC on the node. Here
// rank 0's record is held in its fsync while rank 1 begins a save and a
// trainer asks for the latest step.
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

// A rank's arena creation (here held in the write of the
// job record that describes it, with the rank marked `creating`; not a
// synced one: the record describes shared memory) must not block the RPCs
// of the node's other ranks.
TEST_F(EngineCatalogTest, ArenaCreationInFlightBlocksNoOtherRanksRpc) {
  ASSERT_TRUE(Save(0, 1).ok());
  ASSERT_TRUE(WaitDurable(0, 1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));

  gate_.Arm(/*any=*/true);
  auto create = std::async(std::launch::async, [&] {
    v1::RegisterRequest rr;
    rr.set_job("cat");
    rr.set_rank(1);
    rr.set_world_size(2);
    rr.set_slot_bytes(4 << 20);
    return engine_->Register(peer_, rr).status();
  });
  ASSERT_TRUE(gate_.WaitEntered()) << "rank 1's arena wrote no job record";
  auto others = std::async(std::launch::async, [&] {
    absl::Status s = OtherRanksRpcs(engine_.get(), peer_, 0);
    if (s.ok() && engine_->Status(peer_).arenas_size() != 1)
      s = absl::InternalError("Status lists an arena still being created");
    return s;
  });
  // Not a timing assertion: rank 0's RPCs need nothing of rank 1, so they
  // finish while its creation is held; 20 s only bounds the failure.
  const bool finished =
      others.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "rank 0's RPCs waited for rank 1's arena";
  EXPECT_EQ(create.wait_for(std::chrono::seconds(0)),
            std::future_status::timeout)
      << "Register answered before its job record was written";
  gate_.Release();
  absl::Status s = others.get();
  EXPECT_TRUE(s.ok()) << s;
  s = create.get();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(engine_->Status(peer_).arenas_size(), 2);
}

// Dropping an arena (the backend's unregister, shm_unlink, the
// unmap) ran under the job table's lock, so every RPC on the node waited
// for a deleted job's arenas to go. Here the unregister is held: another
// job's RPCs finish meanwhile, and the Delete answers only once the arena
// is gone.
TEST_F(EngineCatalogTest, ArenaDropInFlightBlocksNoOtherJobsRpc) {
  ASSERT_TRUE(Save(0, 1).ok());
  std::unique_ptr<shm::Arena> gone_arena;
  ASSERT_TRUE(SaveOneTensorStep(engine_.get(), peer_,
                                {.job = "gone", .step = 1, .block = true},
                                &gone_arena)
                  .ok());
  gone_arena.reset();
  ASSERT_TRUE(WaitDurable(0, 1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(20)));
  // Both arenas are registered once their slots are faulted in.
  gated_->AwaitRegistered(2);
  ASSERT_EQ(gated_->registered(), 2);

  gated_->HoldUnregister();
  auto del = std::async(std::launch::async, [&]() -> absl::Status {
    v1::DeleteRequest dr;
    dr.set_job("gone");
    dr.set_all_steps(true);
    return engine_->Delete(peer_, dr).status();
  });
  gated_->AwaitUnregistering(1);  // the Delete drops a registered arena
  ASSERT_EQ(gated_->unregistering(), 1);
  auto others = std::async(std::launch::async, [&] {
    return OtherRanksRpcs(engine_.get(), peer_, 0);
  });
  const bool finished =
      others.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  EXPECT_TRUE(finished) << "job cat's RPCs waited for job gone's arena drop";
  EXPECT_EQ(del.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "Delete answered before the job's arena was gone";
  gated_->ReleaseUnregister();
  absl::Status s = others.get();
  EXPECT_TRUE(s.ok()) << s;
  s = del.get();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(engine_->Status(peer_).arenas_size(), 1);
  struct stat st {};
  EXPECT_NE(::stat(("/dev/shm/" + prefix_ + ".gone.r0").c_str(), &st), 0)
      << "the deleted job's arena is still named";
}

}  // namespace
}  // namespace ckpt::testing
