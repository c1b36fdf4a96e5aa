// The PersistPipeline alone, with a recording PipelineState: a shard's
// persist writes the slot's image to its key on a real local backend
// (checksums filled in and encoded) and records the outcome; a persist
// with nothing to write writes nothing; a manifest that no longer
// describes its step is deleted and built again; an upload from the local
// file sends the verified bytes to the object store (a second real
// backend) and records them, and a local file that changed is refused and
// retried. Real arenas, the real io_uring queue.
#include "daemon/pipeline/pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/core/catalog.h"
#include "daemon/core/catalog_writer.h"
#include "daemon/core/clock.h"
#include "daemon/pipeline/queue_testing.h"
#include "shm/arena.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "storage/shard_image.h"
#include "tests/temp_dir.h"
#include "util/checksum.h"

namespace ckpt::daemon {
namespace {

using testing::EventLog;
using testing::Exists;
using testing::RecordingBackend;

constexpr auto kForever = std::chrono::minutes(10);  // a hung queue, not a race
constexpr uint64_t kSlotBytes = 1 << 20;

// Logs each call; answers from what the test set.
class RecordingState : public PipelineState {
 public:
  explicit RecordingState(EventLog* log) : log_(log) {}

  std::optional<PersistSnapshot> SnapshotPersist(
      const PersistTask& task) override {
    log_->Add(absl::StrCat("snapshot persist ", task.step));
    absl::MutexLock l(&mu_);
    return persist;
  }
  void RecordPersist(const PersistTask& task, PersistOutcome o) override {
    log_->Add(absl::StrCat("record persist ", task.step, " ",
                           o.status.ok() ? "ok" : o.status.ToString()));
    absl::MutexLock l(&mu_);
    outcome = std::move(o);
  }
  std::optional<ManifestSnapshot> SnapshotManifest(const std::string&,
                                                   uint64_t step, bool object,
                                                   bool* written) override {
    log_->Add(
        absl::StrCat("snapshot manifest ", step, object ? " object" : ""));
    absl::MutexLock l(&mu_);
    *written = false;
    return manifest;
  }
  bool RecordManifest(const std::string&, uint64_t step, bool,
                      const ManifestSnapshot&,
                      const absl::Status& status) override {
    absl::MutexLock l(&mu_);
    const bool current = stale_manifests == 0;
    if (!current) --stale_manifests;
    log_->Add(absl::StrCat("record manifest ", step,
                           status.ok() ? " ok" : " failed",
                           current ? "" : " stale"));
    return current;
  }
  absl::StatusOr<UploadSnapshot> SnapshotUpload(
      const UploadTask& task) override {
    log_->Add(absl::StrCat("snapshot upload ", task.step));
    absl::MutexLock l(&mu_);
    return upload;
  }
  bool SlotUnchanged(const UploadTask&, const UploadSnapshot&) override {
    return true;
  }
  void RecordUpload(const UploadTask& task, const std::string& key,
                    uint64_t bytes, double) override {
    log_->Add(absl::StrCat("record upload ", task.step, " ", key, " ", bytes));
  }

  absl::Mutex mu_;
  std::optional<PersistSnapshot> persist ABSL_GUARDED_BY(mu_);
  PersistOutcome outcome ABSL_GUARDED_BY(mu_);
  std::optional<ManifestSnapshot> manifest ABSL_GUARDED_BY(mu_);
  int stale_manifests ABSL_GUARDED_BY(mu_) = 0;
  UploadSnapshot upload ABSL_GUARDED_BY(mu_);

 private:
  EventLog* const log_;
};

class PipelineTest : public ::testing::Test {
 protected:
  PipelineTest()
      : local_(testing::NewLocal(dir_.path() + "/local")),
        object_(testing::NewLocal(dir_.path() + "/object")),
        local_rec_(local_.get(), &log_),
        state_(&log_) {}
  void SetUp() override {
    auto c = Catalog::Open(dir_.path() + "/catalog");
    ASSERT_TRUE(c.ok()) << c.status();
    catalog_ = std::move(*c);
    writer_ = std::make_unique<CatalogWriter>(catalog_.get());
    pipeline_ = std::make_unique<PersistPipeline>(
        &state_, &local_rec_, object_.get(), 1, catalog_.get(), writer_.get(),
        "", &clock_);
  }
  void TearDown() override {
    pipeline_.reset();
    if (!arena_name_.empty()) (void)shm::Arena::Unlink(arena_name_);
  }

  // A slot holding a one-tensor shard of step 1 (its index and footer
  // encoded, its checksum left for the persist), and its snapshot.
  PersistSnapshot StagedShard() {
    shm::ArenaOptions o;
    static std::atomic<int> seq{0};
    arena_name_ = absl::StrCat("/ckpt-pl-", ::getpid(), "-", seq++, ".j.r0");
    o.name = arena_name_;
    o.job = "j";
    o.rank = 0;
    o.world_size = 1;
    o.slot_bytes = kSlotBytes;
    o.num_slots = 2;
    o.user_uid = getuid();
    auto a = shm::Arena::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    PersistSnapshot snap;
    snap.arena = std::shared_ptr<shm::Arena>(std::move(*a));
    snap.image = snap.arena->slot_data(0);
    storage::ShardInfo& info = snap.info;
    info.job = "j";
    info.step = 1;
    info.world_size = 1;
    storage::ShardTensor t;
    t.name = "w";
    t.dtype = DType::kFloat32;
    t.shape = {4096};
    t.bytes = 4096 * 4;
    const uint64_t sizes[] = {t.bytes};
    auto layout = storage::ComputeLayout(sizes);
    EXPECT_TRUE(layout.ok()) << layout.status();
    t.offset = layout->tensor_offsets[0];
    info.tensors.push_back(t);
    EXPECT_TRUE(storage::ValidateShardInfo(&info).ok());
    for (uint64_t i = 0; i < t.bytes; ++i)
      snap.image[t.offset + i] = static_cast<char>(i * 7);
    EXPECT_TRUE(storage::EncodeShardMetadata(
                    info, std::span<char>(snap.image, info.layout.image_bytes))
                    .ok());
    snap.known = {false};
    snap.owner_uid = getuid();
    snap.key = storage::ShardKey("j", 1, 0);
    return snap;
  }
  std::string Read(storage::Backend& b, const std::string& key,
                   uint64_t bytes) {
    std::string out(bytes, '\0');
    EXPECT_TRUE(b.ReadAt(key, 0, out.data(), bytes).ok());
    return out;
  }

  ::ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> local_;
  std::unique_ptr<storage::Backend> object_;
  EventLog log_;
  RecordingBackend local_rec_;
  RecordingState state_;
  ManualClock clock_;
  std::unique_ptr<Catalog> catalog_;
  std::unique_ptr<CatalogWriter> writer_;
  std::unique_ptr<PersistPipeline> pipeline_;
  std::string arena_name_;
};

PersistTask ShardTask(uint64_t step) {
  return PersistTask{PersistTask::kShard, "j", step, 0, 1, {}};
}

TEST_F(PipelineTest, APersistWritesTheSlotAndRecordsItsChecksums) {
  PersistSnapshot snap = StagedShard();
  const uint64_t bytes = snap.info.layout.image_bytes;
  const std::string key = snap.key;
  const uint64_t want = TensorChecksum(snap.image + snap.info.tensors[0].offset,
                                       snap.info.tensors[0].bytes);
  {
    absl::MutexLock l(&state_.mu_);
    state_.persist = snap;
  }
  pipeline_->persist().Push(ShardTask(1));
  pipeline_->Start();
  ASSERT_TRUE(pipeline_->persist().WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), (std::vector<std::string>{"snapshot persist 1",
                                                    "record persist 1 ok"}));
  absl::MutexLock l(&state_.mu_);
  EXPECT_EQ(state_.outcome.image, snap.image);
  ASSERT_EQ(state_.outcome.info.tensors.size(), 1u);
  EXPECT_EQ(state_.outcome.info.tensors[0].checksum, want);
  // The file is the slot's image, byte for byte, its checksum encoded.
  EXPECT_EQ(Read(*local_, key, bytes), std::string(snap.image, bytes));
  EXPECT_TRUE(storage::VerifyTensorChecksums(snap.image, state_.outcome.info,
                                             "the slot")
                  .ok());
}

TEST_F(PipelineTest, APersistWithNothingToWriteWritesNothing) {
  pipeline_->persist().Push(ShardTask(1));  // state_.persist is nullopt
  pipeline_->Start();
  ASSERT_TRUE(pipeline_->persist().WaitIdle(kForever));
  EXPECT_EQ(log_.lines(), std::vector<std::string>{"snapshot persist 1"});
  EXPECT_FALSE(Exists(*local_, storage::ShardKey("j", 1, 0)));
}

TEST_F(PipelineTest, AManifestThatWentStaleIsDeletedAndWrittenAgain) {
  const std::string key = storage::ManifestKey("j", 3);
  {
    absl::MutexLock l(&state_.mu_);
    ManifestSnapshot m;
    m.manifest.set_format("ckptd-manifest-v1");
    m.manifest.set_job("j");
    m.manifest.set_step(3);
    m.manifest.set_world_size(1);
    auto* shard = m.manifest.add_shards();
    shard->set_rank(0);
    shard->set_key(storage::ShardKey("j", 3, 0));
    shard->set_bytes(4096);
    state_.manifest = m;
    state_.stale_manifests = 1;  // a shard changed while it was written
  }
  pipeline_->persist().Push(
      PersistTask{PersistTask::kManifest, "j", 3, 0, 0, {}});
  pipeline_->Start();
  ASSERT_TRUE(pipeline_->persist().WaitIdle(kForever));
  EXPECT_EQ(log_.lines(),
            (std::vector<std::string>{
                "snapshot manifest 3", absl::StrCat("put ", key),
                "record manifest 3 ok stale", absl::StrCat("delete ", key),
                "snapshot manifest 3", absl::StrCat("put ", key),
                "record manifest 3 ok"}));
  auto back = storage::ReadNodeManifest(*local_, key);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step(), 3u);
}

TEST_F(PipelineTest, AnUploadSendsTheVerifiedLocalFileAndRefusesAChangedOne) {
  PersistSnapshot snap = StagedShard();
  {
    absl::MutexLock l(&state_.mu_);
    state_.persist = snap;
  }
  pipeline_->persist().Push(ShardTask(1));
  pipeline_->Start();
  ASSERT_TRUE(pipeline_->persist().WaitIdle(kForever));
  const uint64_t bytes = snap.info.layout.image_bytes;
  {
    absl::MutexLock l(&state_.mu_);
    state_.upload.key = snap.key;
    state_.upload.bytes = bytes;
    state_.upload.info = state_.outcome.info;  // with its checksum
  }
  UploadTask up;
  up.kind = UploadTask::kShard;
  up.job = "j";
  up.step = 1;
  up.gen = 1;
  up.bytes = bytes;
  up.keys = {snap.key};
  pipeline_->upload()->Push(up);
  ASSERT_TRUE(pipeline_->upload()->WaitIdle(kForever));
  EXPECT_EQ(
      log_.lines(),
      (std::vector<std::string>{
          "snapshot persist 1", "record persist 1 ok", "snapshot upload 1",
          absl::StrCat("record upload 1 ", snap.key, " ", bytes)}));
  EXPECT_EQ(Read(*object_, snap.key, bytes), std::string(snap.image, bytes));
  EXPECT_EQ(pipeline_->upload()->Backlog().uploaded_shards, 1u);

  // The job's uid rewrote its file: the upload is refused, and retried.
  ASSERT_TRUE(object_->Delete(snap.key).ok());
  std::string changed(snap.image, bytes);
  changed[snap.info.tensors[0].offset] ^= 1;
  {
    auto w = local_->NewObjectWriter(snap.key, bytes);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->WriteAt(0, changed.data(), bytes).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  const auto retry_at = clock_.Now() + std::chrono::milliseconds(200);
  up.step = 2;  // told apart in the log
  pipeline_->upload()->Push(up);
  clock_.AwaitWaitFor(retry_at);
  EXPECT_EQ(log_.lines().back(), "snapshot upload 2");
  const UploadBacklog b = pipeline_->upload()->Backlog();
  EXPECT_EQ(b.failed, 1u);
  EXPECT_NE(b.last_error.find("upload from the local file"), std::string::npos)
      << b.last_error;
  EXPECT_FALSE(Exists(*object_, snap.key));
}

}  // namespace
}  // namespace ckpt::daemon
