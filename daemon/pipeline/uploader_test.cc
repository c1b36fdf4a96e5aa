// The Uploader alone, on a real local backend standing in for the object
// store: a failed task is retried after a back-off that doubles, timed on
// the injected clock; tasks on one key run in the order queued, a retry
// keeping its place, while other keys go ahead; a delete of several keys
// stops at the first failure and its retry deletes only the rest; the
// backlog counts queued shards until they are done.
#include "daemon/pipeline/uploader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/clock.h"
#include "daemon/pipeline/queue_testing.h"
#include "tests/temp_dir.h"

namespace ckpt::daemon {
namespace {

using std::chrono::milliseconds;
using testing::EventLog;
using testing::Exists;
using testing::RecordingBackend;

constexpr auto kForever = std::chrono::minutes(10);  // a hung queue, not a race

class UploaderTest : public ::testing::Test {
 protected:
  UploaderTest()
      : store_(testing::NewLocal(dir_.path())), backend_(store_.get(), &log_) {}

  // An uploader whose shard and manifest tasks are logged ("shard KEY #n",
  // n the attempt) and fail while their key is in fail_.
  std::unique_ptr<Uploader> NewUploader(unsigned threads) {
    return std::make_unique<Uploader>(
        &backend_, threads,
        [this](const UploadTask& t) -> absl::Status {
          const std::string& key = t.keys.front();
          log_.Add(absl::StrCat(
              t.kind == UploadTask::kShard ? "shard " : "manifest ", key, " #",
              t.attempts));
          absl::MutexLock l(&mu_);
          if (fail_.count(key) > 0 && fail_[key]-- > 0)
            return absl::UnavailableError(absl::StrCat("store down for ", key));
          return absl::OkStatus();
        },
        nullptr, nullptr, &clock_);
  }
  void FailTimes(const std::string& key, int n) {
    absl::MutexLock l(&mu_);
    fail_[key] = n;
  }
  static UploadTask Shard(uint64_t step, const std::string& key,
                          uint64_t bytes) {
    UploadTask t;
    t.kind = UploadTask::kShard;
    t.job = "j";
    t.step = step;
    t.bytes = bytes;
    t.keys = {key};
    return t;
  }

  ::ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> store_;
  EventLog log_;
  RecordingBackend backend_;
  ManualClock clock_;
  absl::Mutex mu_;
  std::map<std::string, int> fail_ ABSL_GUARDED_BY(mu_);
};

TEST_F(UploaderTest, AFailedTaskRetriesAfterABackOffThatDoubles) {
  FailTimes("o/a", 2);
  auto u = NewUploader(1);
  u->Push(Shard(1, "o/a", 100));
  const auto t0 = clock_.Now();
  u->Start();
  EXPECT_EQ(log_.AwaitLines(1), std::vector<std::string>{"shard o/a #0"});
  clock_.AwaitWaitFor(t0 + milliseconds(200));
  UploadBacklog b = u->Backlog();
  EXPECT_EQ(b.failed, 1u);
  EXPECT_EQ(b.last_error, "store down for o/a");
  EXPECT_EQ(b.shards, 1u);  // still owed
  EXPECT_EQ(b.bytes, 100u);
  clock_.Advance(milliseconds(199));
  clock_.AwaitWaitFor(t0 + milliseconds(200));
  EXPECT_EQ(log_.lines().size(), 1u);
  clock_.Advance(milliseconds(1));
  EXPECT_EQ(log_.AwaitLines(2)[1], "shard o/a #1");
  // Failed again: twice the delay, from the time of that failure.
  clock_.AwaitWaitFor(t0 + milliseconds(200 + 400));
  EXPECT_EQ(u->Backlog().failed, 2u);
  clock_.Advance(milliseconds(399));
  clock_.AwaitWaitFor(t0 + milliseconds(200 + 400));
  EXPECT_EQ(log_.lines().size(), 2u);
  clock_.Advance(milliseconds(1));
  ASSERT_TRUE(u->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), (std::vector<std::string>{
                              "shard o/a #0", "shard o/a #1", "shard o/a #2"}));
  b = u->Backlog();
  EXPECT_EQ(b.failed, 2u);
  EXPECT_EQ(b.shards, 0u);
  EXPECT_EQ(b.steps, 0u);
  EXPECT_EQ(b.bytes, 0u);
}

TEST_F(UploaderTest, TasksOnOneKeyKeepTheirOrderAcrossARetry) {
  FailTimes("o/k", 1);
  auto u = NewUploader(2);
  u->Push(Shard(1, "o/k", 1));
  UploadTask manifest;
  manifest.kind = UploadTask::kManifest;
  manifest.job = "j";
  manifest.step = 1;
  manifest.keys = {"o/k"};
  u->Push(manifest);
  u->Push(Shard(2, "o/other", 1));
  const auto retry_at = clock_.Now() + milliseconds(200);
  u->Start();
  std::vector<std::string> first = log_.AwaitLines(2);
  std::sort(first.begin(), first.end());
  EXPECT_EQ(first,
            (std::vector<std::string>{"shard o/k #0", "shard o/other #0"}));
  // A thread looked at the queue after the failure and chose to wait for
  // the retry's time: the manifest, due but behind it on its key, waits.
  clock_.AwaitWaitFor(retry_at);
  EXPECT_EQ(log_.lines().size(), 2u);
  clock_.Advance(milliseconds(200));
  ASSERT_TRUE(u->WaitIdle(kForever));
  const std::vector<std::string> all = log_.lines();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[2], "shard o/k #1");
  EXPECT_EQ(all[3], "manifest o/k #0");
}

TEST_F(UploaderTest, ADeleteStopsAtAFailureAndItsRetryDeletesTheRest) {
  for (const char* k : {"o/m", "o/s1", "o/s2"})
    ASSERT_TRUE(store_->PutSmallObject(k, "x").ok());
  backend_.Fail("o/s1");
  auto u = NewUploader(1);
  UploadTask del;
  del.kind = UploadTask::kDelete;
  del.job = "j";
  del.step = 1;
  del.keys = {"o/m", "o/s1", "o/s2"};  // the manifest first
  u->Push(del);
  const auto retry_at = clock_.Now() + milliseconds(200);
  u->Start();
  clock_.AwaitWaitFor(retry_at);
  EXPECT_EQ(log_.lines(),
            (std::vector<std::string>{"delete o/m", "delete o/s1"}));
  EXPECT_FALSE(Exists(*store_, "o/m"));
  EXPECT_TRUE(Exists(*store_, "o/s1"));
  EXPECT_TRUE(Exists(*store_, "o/s2"));
  EXPECT_EQ(u->Backlog().failed, 1u);
  backend_.Heal();
  clock_.Advance(milliseconds(200));
  ASSERT_TRUE(u->WaitIdle(kForever));
  EXPECT_EQ(log_.lines(),
            (std::vector<std::string>{"delete o/m", "delete o/s1",
                                      "delete o/s1", "delete o/s2"}));
  EXPECT_FALSE(Exists(*store_, "o/s1"));
  EXPECT_FALSE(Exists(*store_, "o/s2"));
}

TEST_F(UploaderTest, TheBacklogCountsQueuedShardsByStep) {
  auto u = NewUploader(1);
  u->Push(Shard(1, "o/1/a", 10));
  u->Push(Shard(1, "o/1/b", 20));
  u->Push(Shard(2, "o/2/a", 30));
  UploadBacklog b = u->Backlog();
  EXPECT_EQ(b.steps, 2u);
  EXPECT_EQ(b.shards, 3u);
  EXPECT_EQ(b.bytes, 60u);
  u->CountUploaded(10, 0.5);  // the pipeline counts what it sent
  u->Start();
  ASSERT_TRUE(u->WaitIdle(kForever));
  b = u->Backlog();
  EXPECT_EQ(b.steps, 0u);
  EXPECT_EQ(b.shards, 0u);
  EXPECT_EQ(b.bytes, 0u);
  EXPECT_EQ(b.uploaded_shards, 1u);
  EXPECT_EQ(b.uploaded_bytes, 10u);
  EXPECT_EQ(b.last_upload_s, 0.5);
  EXPECT_EQ(log_.lines(),
            (std::vector<std::string>{"shard o/1/a #0", "shard o/1/b #0",
                                      "shard o/2/a #0"}));
}

}  // namespace
}  // namespace ckpt::daemon
