// Prefaulter alone: a new arena's other slots are reserved and its memory
// registered off the RPC path, and the outcome lands in the job table; an
// arena dropped meanwhile is unregistered again; a registration the
// backend refuses leaves the slots usable, unregistered. Real arenas and
// a real local backend, observed through a recording wrapper.
#include "daemon/state/prefaulter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "shm/arena.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

constexpr uint32_t kSlots = 3;
constexpr uint64_t kSlotBytes = 1 << 20;

// The backend's registrations as they happen; a test waits on them.
class RecordingBackend : public storage::BackendWrapper {
 public:
  explicit RecordingBackend(storage::Backend* target)
      : BackendWrapper(target) {}
  absl::Status RegisterMemory(void* base, uint64_t len) override {
    absl::MutexLock lock(&mu_);
    registered_.push_back({base, len});
    return refuse_ ? absl::ResourceExhaustedError("refused by the test")
                   : BackendWrapper::RegisterMemory(base, len);
  }
  void UnregisterMemory(void* base) override {
    BackendWrapper::UnregisterMemory(base);
    absl::MutexLock lock(&mu_);
    unregistered_.push_back(base);
    cv_.SignalAll();
  }
  void Refuse() {
    absl::MutexLock lock(&mu_);
    refuse_ = true;
  }
  std::vector<std::pair<void*, uint64_t>> registered() {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  // Returns once `base` was unregistered.
  void AwaitUnregistered(void* base) {
    absl::MutexLock lock(&mu_);
    while (std::find(unregistered_.begin(), unregistered_.end(), base) ==
           unregistered_.end())
      cv_.Wait(&mu_);
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<void*, uint64_t>> registered_ ABSL_GUARDED_BY(mu_);
  std::vector<void*> unregistered_ ABSL_GUARDED_BY(mu_);
  absl::CondVar cv_;
  bool refuse_ ABSL_GUARDED_BY(mu_) = false;
};

class PrefaulterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::LocalBackendOptions o;
    o.root = dir_.path();
    auto b = storage::NewLocalBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    local_ = std::move(*b);
    backend_ = std::make_unique<RecordingBackend>(local_.get());
  }
  void TearDown() override {
    for (const std::string& n : names_) (void)shm::Arena::Unlink(n);
  }
  // An arena of kSlots slots with only slot 0 faulted in, as a first save
  // creates it.
  std::shared_ptr<shm::Arena> NewArena() {
    shm::ArenaOptions o;
    static std::atomic<int> seq{0};
    o.name = absl::StrCat("/ckpt-pf-", ::getpid(), "-", seq++, ".train.r0");
    o.job = "train";
    o.rank = 0;
    o.world_size = 1;
    o.slot_bytes = kSlotBytes;
    o.num_slots = kSlots;
    o.user_uid = getuid();
    o.prefault_slots = 1;
    names_.push_back(o.name);
    auto a = shm::Arena::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::shared_ptr<shm::Arena>(std::move(*a)) : nullptr;
  }
  // Job "train" (world size 1) with `arena` installed for rank 0.
  void Install(const std::shared_ptr<shm::Arena>& arena) {
    JobTable::Lock lock(&table_);
    Job& job = **table_.FindOrAdd("train", getuid(), 1, kSlots);
    job.ranks[0].Install(arena);
  }
  struct Outcome {
    uint32_t ready_slots = 0;
    bool registered = false;
    absl::Status reserve_error;
  };
  // Returns once rank 0 has every slot ready or a reservation error (what
  // a save waiting for a slot waits on).
  Outcome Await() {
    JobTable::Lock lock(&table_);
    for (;;) {
      const RankSlots& r = table_.Find("train")->ranks.at(0);
      if (r.ready_slots == kSlots || !r.reserve_error.ok())
        return {r.ready_slots, r.registered, r.reserve_error};
      table_.Wait(JobTable::Waiter::kSlot);
    }
  }

  ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<RecordingBackend> backend_;
  JobTable table_;
  std::vector<std::string> names_;
};

TEST_F(PrefaulterTest, EverySlotBecomesReadyAndTheWholeArenaIsRegistered) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  {
    JobTable::Lock lock(&table_);
    EXPECT_LT(table_.Find("train")->ranks.at(0).ready_slots, kSlots)
        << "ready before the prefaulter ran";
  }
  Prefaulter p(&table_, backend_.get());
  p.Add(arena, 1);
  const Outcome r = Await();
  EXPECT_TRUE(r.reserve_error.ok()) << r.reserve_error;
  EXPECT_TRUE(r.registered);
  const auto regs = backend_->registered();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(regs[0].first, arena->slot_data(0));
  // Every slot, each rounded up to the arena's page size.
  EXPECT_GE(arena->slot_bytes(), kSlotBytes);
  EXPECT_EQ(regs[0].second, kSlots * arena->slot_bytes());
  // The reserved slots are writable memory.
  std::memset(arena->slot_data(kSlots - 1), 0x5a, kSlotBytes);
}

TEST_F(PrefaulterTest, AnArenaDroppedMeanwhileIsUnregisteredAgain) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  // Not in the table: its rank let it go before the prefaulter got to it.
  Prefaulter p(&table_, backend_.get());
  void* base = arena->slot_data(0);
  p.Add(std::move(arena), 1);
  backend_->AwaitUnregistered(base);
  EXPECT_EQ(backend_->registered().size(), 1u);
}

TEST_F(PrefaulterTest, ARefusedRegistrationLeavesTheSlotsReadyUnregistered) {
  backend_->Refuse();
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  Prefaulter p(&table_, backend_.get());
  p.Add(arena, 1);
  const Outcome r = Await();
  EXPECT_EQ(r.ready_slots, kSlots);
  EXPECT_FALSE(r.registered) << "marked registered after a refusal";
}

// A load holds the prefaulter (a restore's read into a new arena): an
// arena queued meanwhile is neither reserved nor registered until the
// hold ends, then readied as usual.
TEST_F(PrefaulterTest, AnArenaQueuedDuringAHoldWaitsUntilItEnds) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  Prefaulter p(&table_, backend_.get());
  {
    Prefaulter::Hold hold(&p);
    p.Add(arena, 1);
    p.AwaitHeldBack();
    JobTable::Lock lock(&table_);
    EXPECT_EQ(table_.Find("train")->ranks.at(0).ready_slots, 1u)
        << "slots readied during the hold";
    EXPECT_TRUE(backend_->registered().empty()) << "registered during the hold";
  }
  const Outcome r = Await();
  EXPECT_TRUE(r.reserve_error.ok()) << r.reserve_error;
  EXPECT_EQ(r.ready_slots, kSlots);
  EXPECT_TRUE(r.registered);
}

// A hold released and taken again (a load waiting for a slot) lets the
// queue run between; two holds both have to end.
TEST_F(PrefaulterTest, EveryHoldHasToEndBeforeTheQueueRuns) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  Prefaulter p(&table_, backend_.get());
  Prefaulter::Hold first(&p);
  {
    Prefaulter::Hold second(&p);
    second.Release();
    second.Take();
    p.Add(arena, 1);
    p.AwaitHeldBack();
  }
  p.AwaitHeldBack();  // `first` still holds
  EXPECT_TRUE(backend_->registered().empty()) << "ran with a hold left";
  first.Release();
  EXPECT_EQ(Await().ready_slots, kSlots);
}

// A restore's client copying out of an arena (its lease open: BeginRead)
// holds that arena's queued slots back until the read ends.
TEST_F(PrefaulterTest, AnArenaUnderAnOpenRestoreWaitsUntilTheReadEnds) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  Prefaulter p(&table_, backend_.get(), std::chrono::hours(1));
  p.BeginRead(arena->name());
  p.Add(arena, 1);
  p.AwaitHeldBack();
  {
    JobTable::Lock lock(&table_);
    EXPECT_EQ(table_.Find("train")->ranks.at(0).ready_slots, 1u)
        << "slots readied while the restore read";
  }
  p.EndRead(arena->name());
  const Outcome r = Await();
  EXPECT_TRUE(r.reserve_error.ok()) << r.reserve_error;
  EXPECT_EQ(r.ready_slots, kSlots);
}

// The hold is the read arena's alone: an arena queued after it is readied
// meanwhile (here one dropped before its turn: unregistered again).
TEST_F(PrefaulterTest, AnOpenRestoreHoldsBackOnlyItsOwnArena) {
  std::shared_ptr<shm::Arena> read = NewArena();
  std::shared_ptr<shm::Arena> other = NewArena();
  ASSERT_NE(read, nullptr);
  ASSERT_NE(other, nullptr);
  Install(read);
  Prefaulter p(&table_, backend_.get(), std::chrono::hours(1));
  p.BeginRead(read->name());
  p.Add(read, 1);
  void* base = other->slot_data(0);
  p.Add(std::move(other), 1);
  backend_->AwaitUnregistered(base);
  {
    JobTable::Lock lock(&table_);
    EXPECT_EQ(table_.Find("train")->ranks.at(0).ready_slots, 1u)
        << "the read arena's slots readied while the restore read";
  }
  p.EndRead(read->name());
  EXPECT_EQ(Await().ready_slots, kSlots);
}

// A client that never closes its lease holds the arena back for the bound
// only: the slots become ready with the read still open.
TEST_F(PrefaulterTest, AReadLeftOpenHoldsTheArenaForTheBoundOnly) {
  std::shared_ptr<shm::Arena> arena = NewArena();
  ASSERT_NE(arena, nullptr);
  Install(arena);
  Prefaulter p(&table_, backend_.get(), std::chrono::milliseconds(50));
  p.BeginRead(arena->name());
  p.Add(arena, 1);
  const Outcome r = Await();  // no EndRead
  EXPECT_TRUE(r.reserve_error.ok()) << r.reserve_error;
  EXPECT_EQ(r.ready_slots, kSlots);
  p.EndRead(arena->name());
}

}  // namespace
}  // namespace ckpt::daemon
