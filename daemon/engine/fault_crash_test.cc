// Commit logic under injected storage faults, with the engine in-process
// over a FaultInjectionBackend: failed writes are retried, and after a
// simulated crash exactly the committed (durable) steps are visible.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "ckpt/tensor.h"
#include "daemon/core/catalog.h"
#include "daemon/core/clock.h"
#include "daemon/core/metrics.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/fault_backend.h"
#include "storage/shard_format.h"
#include "tests/engine_save.h"
#include "tests/harness.h"
#include "tests/metrics_text.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

using daemon::Catalog;
using daemon::Engine;
using daemon::PeerCreds;

class FaultCrashTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(3); }
  // Opens the engine again with clock_ as its clock: a persist's retry
  // runs when the test moves the clock to its time.
  void UseManualClock() {
    Close();
    clock_ = std::make_unique<daemon::ManualClock>();
    Open(3);
  }
  void TearDown() override {
    engine_.reset();
    UnlinkArenas(prefix_);
  }
  void Open(uint32_t attempts) {
    storage::LocalBackendOptions lo;
    lo.root = dir_.path();
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    fault_ = std::make_unique<storage::FaultInjectionBackend>(local_.get());
    auto cat = Catalog::Open(dir_.path() + "/.catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.retain_steps = 0;
    eo.persist_retry_delay = std::chrono::milliseconds(10);
    eo.persist_retry_max_delay = std::chrono::milliseconds(200);
    eo.max_persist_attempts = attempts;
    eo.metrics = metrics_;
    if (clock_) eo.clock = clock_.get();
    auto e = Engine::Open(eo, fault_.get(), catalog_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }
  void Close() {
    engine_.reset();
    catalog_.reset();
    fault_.reset();
    local_.reset();
  }
  // Saves a 64 KiB tensor filled with `step` through the engine's RPC
  // methods, writing the slot as a client would. `corrupt`: one byte of the
  // slot changes after its checksum was taken (as a stray write would).
  absl::Status SaveStep(uint64_t step, bool corrupt = false) {
    return SaveOneTensorStep(engine_.get(), peer_,
                             {"fault", step, /*block=*/true, corrupt}, &arena_);
  }
  absl::Status WaitDurable(uint64_t step, int timeout_ms = 10000) {
    v1::WaitDurableRequest w;
    w.set_job("fault");
    w.set_step(step);
    w.set_timeout_ms(timeout_ms);
    return engine_->WaitDurable(peer_, w);
  }
  // WaitDurable of a step whose persists fail: its answer once the
  // daemon has judged them (UNAVAILABLE "keeps failing" after
  // max_persist_attempts, or another error), however long the attempts take
  // on a loaded machine; each wait ends early on any change of state.
  absl::Status WaitUntilJudged(uint64_t step) {
    for (;;) {
      absl::Status s = WaitDurable(step, 1000);
      if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    }
  }
  std::vector<uint64_t> DurableSteps() {
    EXPECT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
    v1::ListRequest lr;
    lr.set_job("fault");
    auto list = engine_->List(peer_, lr);
    std::vector<uint64_t> out;
    if (!list.ok()) return out;
    for (const auto& j : list->jobs())
      for (const auto& s : j.steps())
        if (s.durable()) out.push_back(s.step());
    return out;
  }
  std::vector<std::string> ShardFiles() {
    auto keys = local_->List("fault/");
    std::vector<std::string> out;
    for (const auto& k : *keys)
      if (k.size() > 6 && k.compare(k.size() - 6, 6, ".shard") == 0)
        out.push_back(k);
    return out;
  }

  // Saves step `step` of job "fault" with two 64 KiB tensors: "w", a host
  // tensor filled with `host` whose checksum the client took, and "d", a
  // device tensor (has_checksum=false: the daemon computes it) filled with
  // `device`.
  absl::Status SaveHostAndDevice(uint64_t step, char host, char device) {
    v1::RegisterRequest rr;
    rr.set_job("fault");
    rr.set_world_size(1);
    rr.set_slot_bytes(4 << 20);
    auto reg = engine_->Register(peer_, rr);
    if (!reg.ok()) return reg.status();
    if (!arena_ || arena_->name() != reg->shm_name()) {
      auto a = shm::Arena::Attach(reg->shm_name(), reg->arena_bytes(),
                                  reg->slots_offset());
      if (!a.ok()) return a.status();
      arena_ = std::move(*a);
    }
    const std::vector<uint64_t> sizes = {64 << 10, 64 << 10};
    auto layout = storage::ComputeLayout(sizes);
    if (!layout.ok()) return layout.status();
    v1::BeginSaveRequest br;
    br.set_job("fault");
    br.set_step(step);
    br.set_block(true);
    br.set_image_bytes(layout->image_bytes);
    auto begin = engine_->BeginSave(peer_, br);
    if (!begin.ok()) return begin.status();
    v1::CommitSaveRequest cr;
    cr.set_job("fault");
    cr.set_step(step);
    cr.set_slot(begin->slot());
    cr.set_lease(begin->lease());
    for (int i = 0; i < 2; ++i) {
      char* dst =
          arena_->base() + begin->slot_offset() + layout->tensor_offsets[i];
      std::memset(dst, i == 0 ? host : device, sizes[i]);
      v1::TensorMeta* m = cr.add_tensors();
      m->set_name(i == 0 ? "w" : "d");
      m->set_dtype(static_cast<uint32_t>(DType::kUInt8));
      m->add_shape(sizes[i]);
      m->set_offset(layout->tensor_offsets[i]);
      m->set_bytes(sizes[i]);
      m->set_has_checksum(i == 0);
      if (i == 0) m->set_checksum(TensorChecksum(dst, sizes[i]));
    }
    return engine_->CommitSave(peer_, cr);
  }
  // Restores step `step` through a slot load and returns the first byte of
  // each tensor ("w", "d"), or the restore's error.
  absl::StatusOr<std::pair<char, char>> RestoreFirstBytes(uint64_t step) {
    v1::OpenRestoreRequest req;
    req.set_job("fault");
    req.set_step(step);
    auto open = engine_->OpenRestore(peer_, req);
    if (!open.ok()) return open.status();
    auto a = shm::Arena::Attach(open->shm_name(), open->arena_bytes(),
                                shm::Arena::SlotsOffset());
    if (!a.ok()) return a.status();
    const char* image = (*a)->base() + open->slot_offset();
    std::pair<char, char> out{image[open->tensors(0).offset()],
                              image[open->tensors(1).offset()]};
    v1::CloseRestoreRequest close;
    close.set_job("fault");
    close.set_lease(open->lease());
    (void)engine_->CloseRestore(peer_, close);
    return out;
  }

  // The engine's metrics as Prometheus would scrape them.
  std::string MetricsText() {
    return prometheus::TextSerializer().Serialize(metrics_->Collect());
  }

  TempDir dir_;
  std::shared_ptr<daemon::DaemonMetrics> metrics_ =
      std::make_shared<daemon::DaemonMetrics>();
  std::string prefix_ = UniqueShmPrefix();
  PeerCreds peer_{getpid(), getuid(), getgid()};
  std::unique_ptr<daemon::ManualClock> clock_;  // null: the real clock
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<storage::FaultInjectionBackend> fault_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arena_;
};

TEST_F(FaultCrashTest, FailedWriteIsRetriedAndBecomesDurable) {
  fault_->FailNthWrite(1, EIO);
  ASSERT_TRUE(SaveStep(1).ok());
  EXPECT_TRUE(WaitDurable(1).ok());
  EXPECT_EQ(DurableSteps(), std::vector<uint64_t>{1});
}

TEST_F(FaultCrashTest, FailedWriteCountsOneFailureAndOneRetryByKind) {
  fault_->FailNthWrite(1, EIO);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  const std::string text = MetricsText();
  EXPECT_EQ(
      SampleValue(text, "ckptd_failures_total", {{"kind", "persist_write"}}),
      1.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckptd_retries_total", {{"kind", "persist"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckptd_failures_total",
                        {{"kind", "persist_abandoned"}}),
            0.0);
  EXPECT_EQ(
      SampleValue(text, "ckptd_persisted_shards_total", {{"tier", "local"}}),
      1.0);
  EXPECT_EQ(
      SampleValue(text, "ckptd_persist_backlog_shards", {{"tier", "local"}}),
      0.0);
}

TEST_F(FaultCrashTest, SlotChangedAfterCommitCountsAChecksumFailureAndGivesUp) {
  ASSERT_TRUE(SaveStep(1, /*corrupt=*/true).ok());
  absl::Status s = WaitDurable(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  const std::string text = MetricsText();
  EXPECT_EQ(
      SampleValue(text, "ckptd_failures_total", {{"kind", "persist_checksum"}}),
      1.0)
      << text;
  EXPECT_EQ(SampleValue(text, "ckptd_failures_total",
                        {{"kind", "persist_abandoned"}}),
            1.0);
  EXPECT_EQ(SampleValue(text, "ckptd_retries_total", {{"kind", "persist"}}),
            0.0);
  EXPECT_EQ(
      SampleValue(text, "ckptd_persisted_shards_total", {{"tier", "local"}}),
      0.0);
}

TEST_F(FaultCrashTest, PersistentEnospcKeepsRetryingAndWaitDurableSaysWhy) {
  fault_->SetSpaceLimit(0);
  ASSERT_TRUE(SaveStep(1).ok());
  absl::Status s = WaitUntilJudged(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("space"), absl::string_view::npos) << s;
  v1::ListRequest lr;
  lr.set_job("fault");
  auto list = engine_->List(peer_, lr);
  ASSERT_TRUE(list.ok() && list->jobs_size() == 1 &&
              list->jobs(0).steps_size() == 1);
  EXPECT_FALSE(list->jobs(0).steps(0).durable());
  // The step is still restorable from memory; once the disk has room again
  // it becomes durable, and later saves go on.
  fault_->ClearFaults();
  ASSERT_TRUE(SaveStep(2).ok());
  EXPECT_TRUE(WaitDurable(2).ok());
  EXPECT_TRUE(WaitDurable(1, 30000).ok());
}

// Past the fast retries a newer save takes the failing shard's slot rather
// than wait for the disk; that shard then fails for good (its bytes are
// gone) and says so.
TEST_F(FaultCrashTest, NewerSaveTakesTheSlotOfAShardThatKeepsFailing) {
  fault_->SetSpaceLimit(0);
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_EQ(WaitUntilJudged(1).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(SaveStep(2).ok());  // the other slot
  ASSERT_EQ(WaitUntilJudged(2).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(SaveStep(3).ok());  // step 1's slot
  absl::Status s = WaitDurable(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("slot went to step 3"), absl::string_view::npos)
      << s;
  fault_->ClearFaults();
  EXPECT_TRUE(WaitDurable(2, 30000).ok());
  EXPECT_TRUE(WaitDurable(3, 30000).ok());
}

TEST_F(FaultCrashTest, AfterACrashExactlyTheCommittedStepsAreVisible) {
  Close();
  Open(1);  // WaitDurable says a persist is failing after one attempt
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(SaveStep(step).ok());
    ASSERT_TRUE(WaitDurable(step).ok());
  }
  // Step 3's manifest is written after its shard is durable: let it land
  // before faults are injected, or the injected commit failure hits it.
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  // Every write fails from now on (no space): steps 4 and 5 stay in
  // memory, their persists retried, until the machine crashes.
  fault_->SetSpaceLimit(0);
  ASSERT_TRUE(SaveStep(4).ok());
  EXPECT_EQ(WaitUntilJudged(4).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(SaveStep(5).ok());
  EXPECT_EQ(WaitUntilJudged(5).code(), absl::StatusCode::kUnavailable);
  fault_->SimulateCrash();
  arena_.reset();
  Close();
  UnlinkArenas(prefix_);  // a machine crash loses shared memory
  Open(1);
  // Steps 1-3 were durable; 4 and 5 never were. Whatever is listed
  // durable has a whole shard file, and no other shard file exists.
  std::vector<uint64_t> durable = DurableSteps();
  EXPECT_EQ(durable, (std::vector<uint64_t>{1, 2, 3}));
  std::vector<std::string> files = ShardFiles();
  ASSERT_EQ(files.size(), durable.size());
  for (size_t i = 0; i < files.size(); ++i)
    EXPECT_EQ(files[i], storage::ShardKey("fault", durable[i], 0));
}

// A re-save of a step whose older file is durable, lost in a machine crash
// before its own persist: the file at the key is the older timeline's and
// must not be taken for the new save (its device tensor has no client
// checksum to catch the difference).
TEST_F(FaultCrashTest, CrashBeforeAResavePersistsNeverAdoptsTheOlderFile) {
  ASSERT_TRUE(SaveHostAndDevice(1, 'h', 'A').ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  fault_->SetSpaceLimit(0);  // the re-save never reaches the disk
  ASSERT_TRUE(SaveHostAndDevice(1, 'h', 'B').ok());
  arena_.reset();
  Close();
  UnlinkArenas(prefix_);  // a machine crash loses shared memory
  Open(3);
  absl::StatusOr<std::pair<char, char>> got = RestoreFirstBytes(1);
  if (got.ok())
    EXPECT_EQ(got->second, 'B')
        << "step 1 restored the older timeline's device tensor";
  else
    EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
}

// The file is this very save (the crash came between its rename and the
// catalog's update): recovery takes the checksums the file holds, so the
// device tensor is verified from then on.
TEST_F(FaultCrashTest, RecoveredFileKeepsTheDeviceTensorsChecksums) {
  ASSERT_TRUE(SaveHostAndDevice(1, 'h', 'A').ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  arena_.reset();
  Close();
  // The catalog as it was before the persist's update: staged, with the
  // commit's index (no checksum for "d").
  {
    auto cat = Catalog::Open(dir_.path() + "/.catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    auto shards = (*cat)->Shards("fault");
    ASSERT_TRUE(shards.ok() && shards->size() == 1u);
    daemon::catv1::ShardRecord rec = shards->front();
    rec.set_state(daemon::catv1::ShardRecord::STAGED);
    rec.clear_path();
    rec.mutable_tensors(1)->set_has_checksum(false);
    rec.mutable_tensors(1)->set_checksum(0);
    ASSERT_TRUE((*cat)->PutShard(rec, /*sync=*/true).ok());
  }
  UnlinkArenas(prefix_);
  Open(3);
  auto got = RestoreFirstBytes(1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->second, 'A');
  auto shards = catalog_->Shards("fault");
  ASSERT_TRUE(shards.ok() && shards->size() == 1u);
  const v1::TensorMeta& d = shards->front().tensors(1);
  EXPECT_TRUE(d.has_checksum());
  std::vector<char> bytes(64 << 10, 'A');
  EXPECT_EQ(d.checksum(), TensorChecksum(bytes.data(), bytes.size()));
}

// A storage hiccup longer than the fast retries (six failed attempts, past
// max_persist_attempts and the delay's cap, on the injected clock): the
// staged step's bytes are still in memory, so its persist goes on and it
// becomes durable once the disk is back.
TEST_F(FaultCrashTest, StepStagedDuringAStorageOutageBecomesDurableAfterIt) {
  UseManualClock();
  fault_->SetSpaceLimit(0);
  ASSERT_TRUE(SaveStep(1).ok());
  // Six attempts fail; after each the persister waits for its retry's
  // time. The disk is back before the seventh.
  for (int failed = 1; failed <= 6; ++failed) {
    const auto retry = clock_->AwaitWaitAfter(clock_->Now());
    if (failed == 6) fault_->ClearFaults();
    clock_->Advance(retry - clock_->Now());
  }
  EXPECT_TRUE(WaitDurable(1, 30000).ok());
  v1::LatestRequest lr;
  lr.set_job("fault");
  auto latest = engine_->Latest(peer_, lr);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_TRUE(latest->found());
  EXPECT_EQ(latest->step(), 1u);
  EXPECT_TRUE(latest->durable());
}

}  // namespace
}  // namespace ckpt::testing
