// The daemon core's promises on interleavings that once broke them, with
// the engine in-process over a local backend and a real catalog:
// reports carry the job generation, a failed commit changes nothing, a
// FILE restore keeps its file, a save that failed for good is reported,
// and steps that can never become whole do not fill the disk.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/core/catalog.h"
#include "daemon/engine/engine.h"
#include "shm/arena.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/shard_format.h"
#include "tests/engine_save.h"
#include "tests/gated_backend.h"
#include "tests/harness.h"
#include "tests/temp_dir.h"

namespace ckpt::testing {
namespace {

using daemon::Catalog;
using daemon::Engine;
using daemon::PeerCreds;

class EngineCoreTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Close();
    UnlinkArenas(prefix_);
  }
  // `node`: cluster mode as node "a", hosting rank 0 of the job.
  void Open(bool node = false, uint32_t retain = 0, bool object = false) {
    node_ = node;
    retain_ = retain;
    storage::LocalBackendOptions lo;
    lo.root = dir_.path() + "/root";
    auto local = storage::NewLocalBackend(lo);
    ASSERT_TRUE(local.ok()) << local.status();
    local_ = std::move(*local);
    gate_ = std::make_unique<GatedBackend>(local_.get());
    auto cat = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(cat.ok()) << cat.status();
    catalog_ = std::move(*cat);
    daemon::EngineOptions eo;
    eo.shm_prefix = prefix_;
    eo.retain_steps = retain;
    eo.persist_retry_delay = std::chrono::milliseconds(10);
    if (node) {
      eo.node_id = "a";
      eo.on_shard = [this](const daemon::ShardReport& r) {
        std::lock_guard<std::mutex> l(mu_);
        reports_.push_back(r);
      };
      eo.on_fallback = [this](const daemon::FallbackReport& f) {
        std::lock_guard<std::mutex> l(mu_);
        fallbacks_.push_back(f);
      };
    }
    if (object) {
      storage::LocalBackendOptions oo;
      oo.root = dir_.path() + "/object";
      auto store = storage::NewLocalBackend(oo);
      ASSERT_TRUE(store.ok()) << store.status();
      object_ = std::move(*store);
    }
    auto e = Engine::Open(eo, gate_.get(), catalog_.get(), object_.get());
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    if (node) engine_->SetHostedRanks("core", {0}, std::nullopt);
  }
  void Close() {
    engine_.reset();
    catalog_.reset();
    gate_.reset();
    local_.reset();
    object_.reset();
    arenas_[0].reset();
    arenas_[1].reset();
  }
  absl::Status Save(OneTensorSave save) {
    save.job = "core";
    save.block = true;
    return SaveOneTensorStep(engine_.get(), peer_, save, &arenas_[save.rank]);
  }
  absl::Status WaitDurable(uint64_t step) {
    v1::WaitDurableRequest w;
    w.set_job("core");
    w.set_step(step);
    w.set_timeout_ms(10000);
    return engine_->WaitDurable(peer_, w);
  }
  absl::StatusOr<uint64_t> Latest() {
    v1::LatestRequest lr;
    lr.set_job("core");
    auto latest = engine_->Latest(peer_, lr);
    if (!latest.ok()) return latest.status();
    if (!latest->found()) return absl::NotFoundError("no step");
    return latest->step();
  }
  std::vector<uint64_t> Steps() {
    v1::ListRequest lr;
    lr.set_job("core");
    auto list = engine_->List(peer_, lr);
    std::vector<uint64_t> out;
    if (!list.ok()) return out;
    for (const auto& j : list->jobs())
      for (const auto& s : j.steps()) out.push_back(s.step());
    return out;
  }
  std::vector<daemon::ShardReport> Reports() {
    std::lock_guard<std::mutex> l(mu_);
    return reports_;
  }
  size_t ShardFiles() {
    size_t n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(
             dir_.path() + "/root/core", ec);
         !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec))
      if (it->path().extension() == ".shard") ++n;
    return n;
  }

  TempDir dir_;
  const std::string prefix_ = UniqueShmPrefix();
  const PeerCreds peer_{getpid(), getuid(), getgid()};
  bool node_ = false;
  uint32_t retain_ = 0;
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<GatedBackend> gate_;  // over local_: what the engine uses
  std::unique_ptr<storage::Backend> object_;  // the object tier, if any
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<shm::Arena> arenas_[2];
  std::mutex mu_;
  std::vector<daemon::ShardReport> reports_;
  std::vector<daemon::FallbackReport> fallbacks_;
};

// The coordinator can drop an abandoned timeline's saves only if
// every report says which generation the save was made in.
TEST_F(EngineCoreTest, SaveWithAGenerationReportsItAndKeepsItAcrossARestart) {
  Open(/*node=*/true);
  ASSERT_TRUE(Save({.job = "core", .step = 1, .generation = 3}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  std::vector<daemon::ShardReport> reports = Reports();
  ASSERT_GE(reports.size(), 2u);
  for (const daemon::ShardReport& r : reports) {
    ASSERT_TRUE(r.generation.has_value())
        << "step " << r.step << " durable " << r.durable;
    EXPECT_EQ(*r.generation, 3u);
  }
  Close();
  auto cat = Catalog::Open(dir_.path() + "/catalog");
  ASSERT_TRUE(cat.ok()) << cat.status();
  auto shards = (*cat)->Shards("core");
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 1u);
  ASSERT_TRUE((*shards)[0].has_generation());
  EXPECT_EQ((*shards)[0].generation(), 3u);
}

TEST_F(EngineCoreTest, SaveWithoutAGenerationReportsNone) {
  Open(/*node=*/true);
  ASSERT_TRUE(Save({.job = "core", .step = 1}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  for (const daemon::ShardReport& r : Reports())
    EXPECT_FALSE(r.generation.has_value());
}

// A re-save whose catalog write fails (a full disk) must leave
// the durable step it would have replaced as it was, now and after a restart.
TEST_F(EngineCoreTest, ResaveWhoseRecordCannotBeWrittenKeepsTheDurableStep) {
  Open();
  ASSERT_TRUE(Save({.job = "core", .step = 1}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  catalog_->FailPutsForTesting(/*shards=*/true, /*jobs=*/false);
  absl::Status s = Save({.job = "core", .step = 1, .fill = 7});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  catalog_->FailPutsForTesting(false, false);
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  auto latest = Latest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1u);
  EXPECT_EQ(ShardFiles(), 1u);
  Close();
  Open();
  latest = Latest();
  ASSERT_TRUE(latest.ok()) << "after a restart: " << latest.status();
  EXPECT_EQ(*latest, 1u);
  // The slot that failed to commit is free again: the next save works.
  EXPECT_TRUE(Save({.job = "core", .step = 2}).ok());
}

// A grown arena whose job record cannot be written is not
// installed; the rank keeps the arena the catalog describes.
TEST_F(EngineCoreTest, GrowWhoseJobRecordCannotBeWrittenKeepsTheOldArena) {
  Open();
  ASSERT_TRUE(Save({.job = "core", .step = 1}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  auto before = engine_->Status(peer_);
  ASSERT_EQ(before.arenas_size(), 1);
  catalog_->FailPutsForTesting(/*shards=*/false, /*jobs=*/true);
  v1::RegisterRequest rr;
  rr.set_job("core");
  rr.set_world_size(1);
  rr.set_slot_bytes(16 << 20);
  auto reg = engine_->Register(peer_, rr);
  EXPECT_FALSE(reg.ok());
  EXPECT_NE(reg.status().message().find("no space"), std::string::npos)
      << reg.status();
  catalog_->FailPutsForTesting(false, false);
  auto after = engine_->Status(peer_);
  ASSERT_EQ(after.arenas_size(), 1);
  EXPECT_EQ(after.arenas(0).arena_bytes(), before.arenas(0).arena_bytes());
  EXPECT_EQ(after.arenas(0).shm_name(), before.arenas(0).shm_name());
}

// A FILE restore holds its file: a Delete meanwhile waits for
// CloseRestore, and the client reads the bytes it was promised.
TEST_F(EngineCoreTest, FileRestoreReadsItsFileWhileTheStepIsDeleted) {
  Open();
  ASSERT_TRUE(Save({.job = "core", .step = 1, .fill = 0x5a}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  // Without its arena the shard is on disk only: the restore reads the file.
  Close();
  UnlinkArenas(prefix_);
  Open();
  v1::OpenRestoreRequest open;
  open.set_job("core");
  open.set_step(1);
  open.set_allow_file_read(true);
  auto resp = engine_->OpenRestore(peer_, open);
  ASSERT_TRUE(resp.ok()) << resp.status();
  ASSERT_EQ(resp->source(), v1::RESTORE_SOURCE_FILE);
  EXPECT_NE(resp->lease(), 0u);

  v1::DeleteRequest del;
  del.set_job("core");
  del.set_step(1);
  ASSERT_TRUE(engine_->Delete(peer_, del).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));

  const int fd = ::open(resp->path().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << resp->path() << ": " << strerror(errno);
  const v1::TensorMeta& t = resp->tensors(0);
  std::vector<char> bytes(t.bytes());
  ASSERT_EQ(
      ::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(t.offset())),
      static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  EXPECT_EQ(TensorChecksum(bytes.data(), bytes.size()), t.checksum());
  EXPECT_EQ(bytes.front(), 0x5a);

  v1::CloseRestoreRequest close;
  close.set_job("core");
  close.set_lease(resp->lease());
  ASSERT_TRUE(engine_->CloseRestore(peer_, close).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  EXPECT_FALSE(std::filesystem::exists(resp->path()));
}

// Checking that the caller may read a durable shard's file itself (a
// stat, which on an NFS shared root can block for as long as the server
// is away, and an access check) holds no lock that other requests need,
// and a step deleted meanwhile is not handed out.
TEST_F(EngineCoreTest, FileRestoresCheckOfItsFileHoldsNoOtherRequest) {
  Open();
  ASSERT_TRUE(Save({.job = "core", .step = 1, .fill = 0x5a}).ok());
  ASSERT_TRUE(Save({.job = "core", .step = 2, .fill = 0x5b}).ok());
  ASSERT_TRUE(WaitDurable(2).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  Close();
  UnlinkArenas(prefix_);
  Open();
  auto open_restore = [&](uint64_t step) {
    v1::OpenRestoreRequest open;
    open.set_job("core");
    open.set_step(step);
    open.set_allow_file_read(true);
    return engine_->OpenRestore(peer_, open);
  };

  gate_->HoldStat();
  auto restore2 =
      std::async(std::launch::async, [&] { return open_restore(2); });
  gate_->AwaitStating(1);  // the restore checks its file
  ASSERT_EQ(gate_->stating(), 1);
  // Meanwhile: a query, and the delete of the very step being opened.
  auto meanwhile = std::async(std::launch::async, [&] {
    absl::StatusOr<uint64_t> latest = Latest();
    v1::DeleteRequest del;
    del.set_job("core");
    del.set_step(2);
    absl::Status deleted = engine_->Delete(peer_, del).status();
    return std::make_pair(latest, deleted);
  });
  const bool answered =
      meanwhile.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  gate_->ReleaseStat();
  EXPECT_TRUE(answered) << "Latest and Delete waited for the stat";
  auto [latest, deleted] = meanwhile.get();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 2u);
  EXPECT_TRUE(deleted.ok()) << deleted;

  absl::StatusOr<v1::OpenRestoreResponse> resp = restore2.get();
  EXPECT_EQ(resp.status().code(), absl::StatusCode::kNotFound)
      << (resp.ok() ? resp->path() : resp.status().ToString());
  // The other step is still handed out as a file.
  auto resp1 = open_restore(1);
  ASSERT_TRUE(resp1.ok()) << resp1.status();
  EXPECT_EQ(resp1->source(), v1::RESTORE_SOURCE_FILE);
  EXPECT_TRUE(std::filesystem::exists(resp1->path())) << resp1->path();
}

// A save that failed for good is reported, so the coordinator
// stops counting its STAGED report.
TEST_F(EngineCoreTest, PersistThatFailsForGoodIsReportedAsFailed) {
  Open(/*node=*/true);
  ASSERT_TRUE(
      Save({.job = "core", .step = 1, .corrupt = true, .generation = 2}).ok());
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  bool failed = false;
  for (const daemon::ShardReport& r : Reports())
    if (r.step == 1 && r.failed) {
      failed = true;
      EXPECT_FALSE(r.durable);
      EXPECT_EQ(r.generation, std::optional<uint64_t>(2));
    }
  EXPECT_TRUE(failed) << "no report retracts step 1";
}

// The FALLBACK event: a copy a restore found bad is
// reported (for the coordinator's event log), naming the copy, the step
// and where restores go next: the memory copy of a durable step falls
// back to the file; a bad file with no other copy falls back to nothing.
TEST_F(EngineCoreTest, CopyThatFailsVerificationIsReportedAsAFallback) {
  Open(/*node=*/true);
  ASSERT_TRUE(Save({.job = "core", .step = 1, .fill = 0x5a}).ok());
  ASSERT_TRUE(WaitDurable(1).ok());
  auto restore_and_reject = [&](const std::string& why) {
    v1::OpenRestoreRequest open;
    open.set_job("core");
    open.set_step(1);
    open.set_allow_file_read(true);
    auto resp = engine_->OpenRestore(peer_, open);
    ASSERT_TRUE(resp.ok()) << resp.status();
    v1::CloseRestoreRequest close;
    close.set_job("core");
    close.set_lease(resp->lease());
    close.set_bad_copy(why);
    ASSERT_TRUE(engine_->CloseRestore(peer_, close).ok());
  };
  // Both copies are really bad (the daemon checks a claim before it acts):
  // a stray write into the slot, then a flipped bit in the file.
  auto flip_slot = [&] {
    shm::Arena& arena = *arenas_[0];
    for (uint32_t i = 0; i < arena.num_slots(); ++i)
      if (arena.slot_state(i) == shm::SlotState::kDurable &&
          arena.header().slots[i].step.load() == 1) {
        char* image = arena.slot_data(i);
        auto header = storage::DecodeHeader({image, storage::kShardAlign});
        ASSERT_TRUE(header.ok()) << header.status();
        image[header->data_offset] ^= 0x20;
        return;
      }
    FAIL() << "no slot holds step 1";
  };
  flip_slot();
  restore_and_reject("tensor 0: checksum mismatch");
  std::vector<daemon::FallbackReport> got;
  {
    std::lock_guard<std::mutex> l(mu_);
    got = fallbacks_;
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].job, "core");
  EXPECT_EQ(got[0].step, 1u);
  EXPECT_EQ(got[0].rank, 0u);
  EXPECT_EQ(got[0].copy, "memory");
  EXPECT_EQ(got[0].next_copy, "file");
  EXPECT_NE(got[0].reason.find("checksum mismatch"), std::string::npos)
      << got[0].reason;

  FlipFirstTensorByteOfFile(dir_.path() + "/root/" +
                            storage::ShardKey("core", 1, 0, "a"));
  restore_and_reject("tensor 0: checksum mismatch in the file");
  {
    std::lock_guard<std::mutex> l(mu_);
    got = fallbacks_;
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].copy, "file");
  EXPECT_EQ(got[1].next_copy, "");
  EXPECT_TRUE(got[0].verified_bad);
  EXPECT_TRUE(got[1].verified_bad);
}

// With one rank failing every persist no step is ever whole;
// retention must still bound what stays on disk.
TEST_F(EngineCoreTest, StepsThatCanNeverBeWholeDoNotFillTheDisk) {
  Open(/*node=*/false, /*retain=*/2);
  for (uint64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(
        Save({.job = "core", .step = step, .rank = 0, .world_size = 2}).ok());
    ASSERT_TRUE(Save({.job = "core",
                      .step = step,
                      .corrupt = true,
                      .rank = 1,
                      .world_size = 2})
                    .ok());
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  }
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  std::vector<uint64_t> steps = Steps();
  EXPECT_LE(steps.size(), 2u) << "steps kept: " << steps.size();
  EXPECT_LE(ShardFiles(), 2u);
  // The newest are the ones kept.
  if (!steps.empty()) {
    EXPECT_EQ(steps.back(), 6u);
  }
}

// The same with an object tier: were a step that can never be whole
// counted by neither tier's retention, both tiers would fill.
TEST_F(EngineCoreTest, StepsThatCanNeverBeWholeDoNotFillEitherTier) {
  Open(/*node=*/false, /*retain=*/2, /*object=*/true);
  for (uint64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(
        Save({.job = "core", .step = step, .rank = 0, .world_size = 2}).ok());
    ASSERT_TRUE(Save({.job = "core",
                      .step = step,
                      .corrupt = true,
                      .rank = 1,
                      .world_size = 2})
                    .ok());
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  }
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  std::vector<uint64_t> steps = Steps();
  EXPECT_LE(steps.size(), 2u) << "steps kept: " << steps.size();
  EXPECT_LE(ShardFiles(), 2u);
}

}  // namespace
}  // namespace ckpt::testing
