// The job table's transitions that return their effects (effects.h), on
// their own: sequences of transitions on one table with real arenas, each
// checked against the exact effects it must hand to the Engine — the
// catalog edit and its sync, the persist and upload tasks, the reports to
// the coordinator, the deletes owed, the decisions left to the executor
// and whom to wake. No Engine, no thread: `now` is passed in, read from a
// ManualClock as the Engine reads its injected clock.
#include "daemon/state/job_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/clock.h"
#include "shm/arena.h"
#include "storage/keys.h"

namespace ckpt::daemon {
namespace {

using std::chrono::milliseconds;

// A task as "kind job/step/rank gen [+delay]", so that lists compare whole.
std::string Describe(const PersistTask& t,
                     std::chrono::steady_clock::time_point now) {
  const char* kinds[] = {"shard", "manifest", "delete"};
  std::string s = absl::StrCat(kinds[t.kind], " ", t.job, "/", t.step, "/",
                               t.rank, " gen ", t.gen);
  if (t.not_before != std::chrono::steady_clock::time_point{})
    absl::StrAppend(
        &s, " +",
        std::chrono::duration_cast<milliseconds>(t.not_before - now).count(),
        "ms");
  return s;
}
std::vector<std::string> Persists(const Effects& fx,
                                  std::chrono::steady_clock::time_point now) {
  std::vector<std::string> out;
  for (const PersistTask& t : fx.persist) out.push_back(Describe(t, now));
  return out;
}
// A report as "job/step/rank staged|durable|failed bytes uid key".
std::vector<std::string> Reports(const Effects& fx) {
  std::vector<std::string> out;
  for (const ShardReport& r : fx.reports)
    out.push_back(
        absl::StrCat(r.job, "/", r.step, "/", r.rank, " ",
                     r.failed ? "failed" : (r.durable ? "durable" : "staged"),
                     " ", r.bytes, " uid ", r.owner_uid, " key '", r.key, "'"));
  return out;
}

class JobTableEffectsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& n : names_) (void)shm::Arena::Unlink(n);
  }
  // A table with `rules`, holding job "train" (world size 1) with a
  // two-slot arena for rank 0. The test holds the table's lock throughout
  // (Lock), as the Engine does around a transition.
  Job& NewJob(JobTable& table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(table.mu()) {
    Job& job = **table.FindOrAdd("train", uid_, 1, 2);
    job.recorded = true;
    shm::ArenaOptions o;
    static std::atomic<int> seq{0};
    o.name = absl::StrCat("/ckpt-jt-", ::getpid(), "-", seq++, ".train.r0");
    o.job = "train";
    o.rank = 0;
    o.world_size = 1;
    o.slot_bytes = 1 << 20;
    o.num_slots = 2;
    o.user_uid = uid_;
    names_.push_back(o.name);
    auto a = shm::Arena::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    job.ranks[0].Install(std::shared_ptr<shm::Arena>(std::move(*a)));
    return job;
  }
  // A committed save of `step`, rank 0, in slot 0 (what CommitSave stages).
  static Shard Staged(uint64_t step) {
    Shard s;
    s.rec.set_job("train");
    s.rec.set_step(step);
    s.rec.set_rank(0);
    s.rec.set_world_size(1);
    s.Start(ShardPhase::kStaged);
    s.rec.set_slot(0);
    s.rec.set_image_bytes(4096);
    s.slot = 0;
    s.info.layout.image_bytes = 4096;
    return s;
  }
  static CatalogEdit Put(const Shard& shard) {
    CatalogEdit e;
    e.PutShard(shard.rec);
    return e;
  }
  static PersistOutcome Outcome(absl::Status s, const Job& job) {
    PersistOutcome o;
    o.status = std::move(s);
    o.info.layout.image_bytes = 4096;
    o.image = job.ranks.at(0).arena->slot_data(0);
    o.seconds = 0.5;
    return o;
  }

  const uint32_t uid_ = ::geteuid();
  ManualClock clock_;  // the Engine's EngineOptions::clock
  const std::string key_ = "train/step-5/rank-0.shard";
  std::vector<std::string> names_;
};

TEST_F(JobTableEffectsTest, ACommitRecordsReportsAndQueuesItsPersist) {
  JobTable table;
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  Effects fx = table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  const Shard* shard = table.FindShard("train", 5, 0);
  ASSERT_NE(shard, nullptr);
  EXPECT_EQ(shard->gen, gen);
  EXPECT_EQ(job.ranks[0].slots[0].state, shm::SlotState::kStaged);

  EXPECT_TRUE(fx.edit == Put(*shard));
  EXPECT_FALSE(fx.sync);  // a staged shard lives in shared memory
  EXPECT_EQ(Persists(fx, clock_.Now()), std::vector<std::string>{absl::StrCat(
                                            "shard train/5/0 gen ", gen)});
  EXPECT_EQ(Reports(fx), std::vector<std::string>{absl::StrCat(
                             "train/5/0 staged 4096 uid ", uid_, " key ''")});
  EXPECT_TRUE(fx.upload.empty());
  EXPECT_TRUE(fx.deletes.empty());
  EXPECT_FALSE(fx.retention || fx.forget_job || fx.wake_slots ||
               fx.wake_durable);
}

TEST_F(JobTableEffectsTest,
       APersistedShardIsRecordedReportedAndItsManifestDue) {
  JobTable table;
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  Shard& shard = *table.FindShard("train", 5, 0);
  ASSERT_TRUE(table.MoveShard(job, shard, ShardPhase::kPersisting));

  const PersistTask task{PersistTask::kShard, "train", 5, 0, gen, {}};
  JobTable::PersistResult r =
      table.Persisted(task, key_, Outcome(absl::OkStatus(), job), clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kDurable);
  EXPECT_EQ(r.bytes, 4096u);
  EXPECT_EQ(shard.phase, ShardPhase::kDurable);
  EXPECT_EQ(shard.rec.path(), key_);
  EXPECT_EQ(job.ranks[0].slots[0].state, shm::SlotState::kDurable);

  const Effects& fx = r.effects;
  EXPECT_TRUE(fx.edit == Put(shard));
  EXPECT_TRUE(fx.sync);  // recovery adopts the file only from a record
  EXPECT_EQ(Reports(fx),
            std::vector<std::string>{absl::StrCat("train/5/0 durable 4096 uid ",
                                                  uid_, " key '", key_, "'")});
  // The step (world size 1) is complete and durable: its manifest is due.
  EXPECT_EQ(Persists(fx, clock_.Now()),
            std::vector<std::string>{"manifest train/5/0 gen 0"});
  EXPECT_TRUE(fx.upload.empty());  // no object tier
  EXPECT_TRUE(fx.deletes.empty());
  EXPECT_FALSE(fx.retention || fx.forget_job);
  EXPECT_TRUE(fx.wake_slots && fx.wake_durable);
}

TEST_F(JobTableEffectsTest, WithAnObjectCommitTierAPersistUploadsUnreported) {
  JobTable::Rules rules;
  rules.upload = true;
  rules.object_commit = true;
  JobTable table(rules);
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  ASSERT_TRUE(table.MoveShard(job, *table.FindShard("train", 5, 0),
                              ShardPhase::kPersisting));
  const PersistTask task{PersistTask::kShard, "train", 5, 0, gen, {}};
  Effects fx =
      table.Persisted(task, key_, Outcome(absl::OkStatus(), job), clock_.Now())
          .effects;
  ASSERT_EQ(fx.upload.size(), 1u);
  const UploadTask& up = fx.upload[0];
  EXPECT_EQ(up.kind, UploadTask::kShard);
  EXPECT_EQ(absl::StrCat(up.job, "/", up.step, "/", up.rank, " gen ", up.gen,
                         " ", up.bytes),
            absl::StrCat("train/5/0 gen ", gen, " 4096"));
  EXPECT_EQ(up.keys, std::vector<std::string>{key_});
  // Durable in the commit tier only once uploaded: no report yet.
  EXPECT_TRUE(fx.reports.empty());
  EXPECT_EQ(Persists(fx, clock_.Now()),
            std::vector<std::string>{"manifest train/5/0 gen 0"});
}

TEST_F(JobTableEffectsTest, AFailedPersistRetriesLaterThenGivesUpItsSlot) {
  // Two attempts, 200 ms doubling: the second failure lets the slot go.
  JobTable::Rules rules;
  rules.persist_retry = {2, milliseconds(200), milliseconds(30000)};
  JobTable table(rules);
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  Shard& shard = *table.FindShard("train", 5, 0);
  const PersistTask task{PersistTask::kShard, "train", 5, 0, gen, {}};

  ASSERT_TRUE(table.MoveShard(job, shard, ShardPhase::kPersisting));
  JobTable::PersistResult r = table.Persisted(
      task, key_, Outcome(absl::UnavailableError("disk busy"), job),
      clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kRetry);
  EXPECT_EQ(r.attempts, 1u);
  EXPECT_EQ(shard.phase, ShardPhase::kStaged);
  EXPECT_EQ(shard.rec.error(), "disk busy");
  EXPECT_EQ(job.ranks[0].slots[0].state, shm::SlotState::kStaged);
  EXPECT_FALSE(job.ranks[0].slots[0].reclaimable);
  EXPECT_TRUE(r.effects.edit.empty());  // nothing new to record
  EXPECT_TRUE(r.effects.reports.empty());
  EXPECT_EQ(Persists(r.effects, clock_.Now()),
            std::vector<std::string>{
                absl::StrCat("shard train/5/0 gen ", gen, " +200ms")});

  // The retry's time came, and it failed again: twice the delay from then.
  clock_.Advance(milliseconds(200));
  ASSERT_TRUE(table.MoveShard(job, shard, ShardPhase::kPersisting));
  r = table.Persisted(task, key_,
                      Outcome(absl::UnavailableError("disk busy"), job),
                      clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kRetry);
  EXPECT_EQ(r.attempts, 2u);
  EXPECT_EQ(Persists(r.effects, clock_.Now()),
            std::vector<std::string>{
                absl::StrCat("shard train/5/0 gen ", gen, " +400ms")});
  // The bytes stay for the retry, but a newer save may take the slot.
  EXPECT_EQ(shard.phase, ShardPhase::kStaged);
  EXPECT_TRUE(job.ranks[0].slots[0].reclaimable);
}

TEST_F(JobTableEffectsTest, ACorruptPersistFailsTheShardAndRunsRetention) {
  JobTable table;
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  Shard& shard = *table.FindShard("train", 5, 0);
  ASSERT_TRUE(table.MoveShard(job, shard, ShardPhase::kPersisting));
  const PersistTask task{PersistTask::kShard, "train", 5, 0, gen, {}};
  JobTable::PersistResult r = table.Persisted(
      task, key_, Outcome(absl::DataLossError("checksum of 'w'"), job),
      clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kAbandon);
  EXPECT_EQ(shard.phase, ShardPhase::kFailed);
  EXPECT_EQ(shard.rec.error(), "checksum of 'w'");

  const Effects& fx = r.effects;
  EXPECT_TRUE(fx.edit == Put(shard));
  EXPECT_TRUE(fx.sync);
  EXPECT_EQ(Reports(fx), std::vector<std::string>{absl::StrCat(
                             "train/5/0 failed 4096 uid ", uid_, " key ''")});
  EXPECT_TRUE(fx.persist.empty());
  EXPECT_TRUE(fx.retention);  // the step can never be whole now
  EXPECT_FALSE(fx.forget_job);
}

TEST_F(JobTableEffectsTest, APersistOfASaveThatWentOwesTheDeleteOfItsFile) {
  JobTable table;
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  ASSERT_TRUE(table.EraseShard(job, 5, 0));  // deleted while it was written
  const PersistTask task{PersistTask::kShard, "train", 5, 0, gen, {}};
  JobTable::PersistResult r =
      table.Persisted(task, key_, Outcome(absl::OkStatus(), job), clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kOrphan);
  const Effects& fx = r.effects;
  ASSERT_EQ(fx.deletes.size(), 1u);
  EXPECT_EQ(absl::StrCat(fx.deletes[0].job, "/", fx.deletes[0].step, " ",
                         fx.deletes[0].key),
            absl::StrCat("train/5 ", key_));
  EXPECT_TRUE(fx.forget_job);  // the job goes if Delete marked it
  EXPECT_TRUE(fx.edit.empty());
  EXPECT_TRUE(fx.reports.empty());
  EXPECT_TRUE(fx.persist.empty());

  // A failed write of a save that went leaves no file to delete.
  r = table.Persisted(task, key_,
                      Outcome(absl::UnavailableError("disk busy"), job),
                      clock_.Now());
  EXPECT_EQ(r.verdict.kind, PersistVerdict::kOrphan);
  EXPECT_TRUE(r.effects.deletes.empty());
}

TEST_F(JobTableEffectsTest, AnUploadRecordsReportsAndQueuesTheObjectManifest) {
  JobTable::Rules rules;
  rules.upload = true;
  rules.object_commit = true;
  rules.node_id = "node-a";
  JobTable table(rules);
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  Shard& shard = *table.FindShard("train", 5, 0);
  ASSERT_TRUE(table.MoveShard(job, shard, ShardPhase::kPersisting));
  const PersistTask persist{PersistTask::kShard, "train", 5, 0, gen, {}};
  (void)table.Persisted(persist, key_, Outcome(absl::OkStatus(), job),
                        clock_.Now());

  const UploadTask task{UploadTask::kShard, "train", 5, 0, gen, 4096, {key_}};
  Effects fx = table.Uploaded(task, key_);
  EXPECT_TRUE(shard.uploaded);
  EXPECT_TRUE(shard.rec.uploaded());
  EXPECT_TRUE(fx.edit == Put(shard));
  EXPECT_FALSE(fx.sync);
  // The object tier is the commit tier: durable now.
  EXPECT_EQ(Reports(fx),
            std::vector<std::string>{absl::StrCat("train/5/0 durable 4096 uid ",
                                                  uid_, " key '", key_, "'")});
  ASSERT_EQ(fx.upload.size(), 1u);
  EXPECT_EQ(fx.upload[0].kind, UploadTask::kManifest);
  EXPECT_EQ(fx.upload[0].keys, std::vector<std::string>{
                                   storage::ManifestKey("train", 5, "node-a")});
  EXPECT_TRUE(fx.object_deletes.empty());
  EXPECT_TRUE(fx.wake_durable);

  // A save that went while it was uploaded: its object goes too.
  ASSERT_TRUE(table.EraseShard(job, 5, 0));
  fx = table.Uploaded(task, key_);
  EXPECT_TRUE(fx.edit.empty());
  EXPECT_TRUE(fx.reports.empty());
  ASSERT_EQ(fx.object_deletes.size(), 1u);
  EXPECT_EQ(fx.object_deletes[0].kind, UploadTask::kDelete);
  EXPECT_EQ(fx.object_deletes[0].keys, std::vector<std::string>{key_});
}

TEST_F(JobTableEffectsTest, AShardFailsOnceWithItsRecordAndRetraction) {
  JobTable table;
  JobTable::Lock lock(&table);
  Job& job = NewJob(table);
  uint64_t gen = 0;
  (void)table.Commit(job, job.ranks[0], 0, Staged(5), &gen);
  Shard& shard = *table.FindShard("train", 5, 0);
  Effects fx = table.Fail(shard, "every copy failed");
  EXPECT_EQ(shard.phase, ShardPhase::kFailed);
  EXPECT_TRUE(fx.edit == Put(shard));
  EXPECT_TRUE(fx.sync);
  EXPECT_EQ(Reports(fx), std::vector<std::string>{absl::StrCat(
                             "train/5/0 failed 4096 uid ", uid_, " key ''")});
  // Already failed: nothing to record or report again.
  fx = table.Fail(shard, "again");
  EXPECT_TRUE(fx.edit.empty());
  EXPECT_TRUE(fx.reports.empty());
  EXPECT_EQ(shard.rec.error(), "every copy failed");
}

}  // namespace
}  // namespace ckpt::daemon
