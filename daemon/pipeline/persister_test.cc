// The Persister alone: its tasks run one at a time in the order queued,
// shards and manifests through its owner's callback and deletes by
// itself, on a real local backend; a task waits for its not_before on the
// injected clock; a delete forgets its intent in a real catalog once done,
// and a failed one leaves the intent for the next start; Stop keeps what
// is queued.
#include "daemon/pipeline/persister.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/clock.h"
#include "daemon/pipeline/queue_testing.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

using testing::EventLog;
using testing::Exists;
using testing::RecordingBackend;

constexpr auto kForever = std::chrono::minutes(10);  // a hung queue, not a race

class PersisterTest : public ::testing::Test {
 protected:
  PersisterTest()
      : local_(testing::NewLocal(dir_.path() + "/root")),
        backend_(local_.get(), &log_) {}

  // A persister whose shard and manifest tasks are logged.
  std::unique_ptr<Persister> NewPersister(Catalog* catalog = nullptr,
                                          CatalogWriter* writer = nullptr) {
    return std::make_unique<Persister>(
        &backend_,
        [this](const PersistTask& t) {
          log_.Add(absl::StrCat(
              t.kind == PersistTask::kShard ? "shard " : "manifest ", t.job,
              " ", t.step));
        },
        catalog, writer, &clock_);
  }
  void Put(const std::string& key) {
    ASSERT_TRUE(local_->PutSmallObject(key, "bytes").ok());
  }
  static PersistTask Task(PersistTask::Kind kind, uint64_t step) {
    PersistTask t;
    t.kind = kind;
    t.job = "j";
    t.step = step;
    return t;
  }

  ::ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> local_;
  EventLog log_;
  RecordingBackend backend_;
  ManualClock clock_;
};

TEST_F(PersisterTest, RunsItsTasksOneAtATimeInTheOrderQueued) {
  Put("j/1/a");
  Put("j/2/b");
  Put("j/2/c");
  auto p = NewPersister();
  p->Push(Task(PersistTask::kShard, 1));
  p->QueueDelete("j/1/a", /*prefix=*/false);
  p->Push(Task(PersistTask::kManifest, 1));
  p->QueueDelete("j/2/", /*prefix=*/true);
  EXPECT_EQ(p->Size(), 4u);
  EXPECT_FALSE(p->Idle());
  p->Start();
  ASSERT_TRUE(p->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(),
            (std::vector<std::string>{"shard j 1", "delete j/1/a",
                                      "manifest j 1", "delete-prefix j/2/"}));
  EXPECT_FALSE(Exists(*local_, "j/1/a"));
  EXPECT_FALSE(Exists(*local_, "j/2/b"));
  EXPECT_FALSE(Exists(*local_, "j/2/c"));
  EXPECT_EQ(p->progress(), 4u);  // one per task done
  EXPECT_FALSE(p->running());
  EXPECT_EQ(p->queued(), 0u);
}

TEST_F(PersisterTest, ATaskWaitsForItsTimeOnTheClock) {
  auto p = NewPersister();
  PersistTask later = Task(PersistTask::kShard, 1);
  later.not_before = clock_.Now() + std::chrono::seconds(1);
  p->Push(later);
  p->Push(Task(PersistTask::kShard, 2));
  p->Start();
  // The due task runs first; the other waits for its time, not for a
  // notification: the clock sees a wait for exactly that time.
  EXPECT_EQ(log_.AwaitLines(1), std::vector<std::string>{"shard j 2"});
  clock_.AwaitWaitFor(later.not_before);
  EXPECT_EQ(p->Size(), 1u);
  EXPECT_EQ(log_.lines().size(), 1u);
  clock_.Advance(std::chrono::milliseconds(999));
  clock_.AwaitWaitFor(later.not_before);  // still waiting, nothing ran
  EXPECT_EQ(log_.lines().size(), 1u);
  clock_.Advance(std::chrono::milliseconds(1));
  ASSERT_TRUE(p->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), (std::vector<std::string>{"shard j 2", "shard j 1"}));
}

TEST_F(PersisterTest, StopKeepsTheQueuedTasks) {
  auto p = NewPersister();
  PersistTask later = Task(PersistTask::kManifest, 7);
  later.not_before = clock_.Now() + std::chrono::seconds(5);
  p->Push(later);
  p->Start();
  clock_.AwaitWaitFor(later.not_before);
  p->Stop();
  EXPECT_EQ(p->Size(), 1u);
  EXPECT_TRUE(log_.lines().empty());
}

class PersisterIntentTest : public PersisterTest {
 protected:
  void SetUp() override {
    auto c = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = std::move(*c);
    writer_ = std::make_unique<CatalogWriter>(catalog_.get());
  }
  // Records the intent to delete `key` through the writer: (id, ticket).
  std::pair<uint64_t, uint64_t> RecordIntent(const std::string& key) {
    catv1::DeleteIntent intent;
    intent.set_tier(catv1::DeleteIntent::LOCAL);
    intent.add_keys(key);
    intent.set_job("j");
    CatalogEdit edit;
    const uint64_t id = catalog_->NewIntentId();
    edit.PutDeleteIntent(id, intent);
    return {id, writer_->Enqueue(std::move(edit), /*sync=*/true)};
  }
  std::vector<uint64_t> Intents() {
    auto all = catalog_->DeleteIntents();
    EXPECT_TRUE(all.ok()) << all.status();
    std::vector<uint64_t> ids;
    for (const auto& [id, intent] : *all) ids.push_back(id);
    return ids;
  }

  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<CatalogWriter> writer_;
};

TEST_F(PersisterIntentTest, ADoneDeleteForgetsItsIntent) {
  Put("j/1/a");
  auto p = NewPersister(catalog_.get(), writer_.get());
  auto [id, ticket] = RecordIntent("j/1/a");
  p->QueueDelete("j/1/a", false, id, ticket);
  p->Start();
  ASSERT_TRUE(p->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), std::vector<std::string>{"delete j/1/a"});
  EXPECT_FALSE(Exists(*local_, "j/1/a"));
  EXPECT_TRUE(Intents().empty());
}

TEST_F(PersisterIntentTest, AFailedDeleteLeavesItsIntentForTheNextStart) {
  Put("j/1/a");
  backend_.Fail("j/1/a");
  auto p = NewPersister(catalog_.get(), writer_.get());
  auto [id, ticket] = RecordIntent("j/1/a");
  p->QueueDelete("j/1/a", false, id, ticket);
  p->Start();
  ASSERT_TRUE(p->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), std::vector<std::string>{"delete j/1/a"});
  EXPECT_TRUE(Exists(*local_, "j/1/a"));
  EXPECT_EQ(Intents(), std::vector<uint64_t>{id});  // not retried here
}

}  // namespace
}  // namespace ckpt::daemon
