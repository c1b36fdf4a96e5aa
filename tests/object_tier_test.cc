// The object tier with a real ckptd process (--object-url, --commit-tier
// object), against a directory (the Backend stand-in) and against a real
// S3 server (s3rver, tests/s3_server.h): a round trip through the object
// tier is bit-exact, and a step whose local file and shared memory are
// gone restores from the object store (source OBJECT).
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "client/restore_progress.h"
#include "daemon/core/catalog.h"
#include "shm/arena.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_reader.h"
#include "tests/daemon_test.h"
#include "tests/eventually.h"
#include "tests/s3_server.h"

namespace ckpt::testing {
namespace {

std::string ReadAll(storage::Backend& b, const std::string& key) {
  auto size = b.ObjectSize(key);
  if (!size.ok()) return "missing: " + std::string(size.status().message());
  std::string out(*size, '\0');
  absl::Status s = b.ReadAt(key, 0, out.data(), out.size());
  return s.ok() ? out : "unreadable: " + std::string(s.message());
}

// "dir": the object tier is a directory; "s3": an s3rver bucket.
class ObjectTierTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "s3") {
      if (std::string why = S3Server::Unavailable(); !why.empty())
        GTEST_SKIP() << why;
      s3_ = std::make_unique<S3Server>();
      ASSERT_TRUE(s3_->ok());
      // The daemon takes endpoint and credentials from the environment.
      ExportS3Environment(s3_->endpoint());
      url_ = std::string("s3://") + kS3Bucket + "/tier";
      auto b = storage::NewObjectBackend(s3_->Options("tier"));
      ASSERT_TRUE(b.ok()) << b.status();
      objects_ = std::move(*b);
    } else {
      url_ = dir_.path() + "/object";
      storage::LocalBackendOptions lo;
      lo.root = url_;
      lo.remove_tmp_files = false;
      auto b = storage::NewLocalBackend(lo);
      ASSERT_TRUE(b.ok()) << b.status();
      objects_ = std::move(*b);
    }
    Start();
  }
  void TearDown() override {
    daemon_.reset();
    UnlinkArenas(prefix_);
  }
  void Start() {
    auto d =
        DaemonProcess::Start(dir_.path() + "/root", dir_.path(), prefix_,
                             {"--object-url", url_, "--commit-tier", "object"});
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = std::move(*d);
  }
  std::unique_ptr<Client> Connect(const std::string& job) {
    auto c = Client::Connect(OptionsFor(*daemon_, job, 0, 1));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  v1::StatusResponse Status() {
    grpc::ClientContext ctx;
    v1::StatusResponse resp;
    EXPECT_TRUE(daemon_->Stub()->Status(&ctx, v1::StatusRequest(), &resp).ok());
    return resp;
  }
  // The step's object manifest follows its last shard's upload.
  // Job "obj" saves step 1 (in the object tier too), then ckptd stops
  // and its arenas go: only the stored copies are left.
  void SaveStepOneThenStopAndDropSharedMemory() {
    {
      auto client = Connect("obj");
      ASSERT_NE(client, nullptr);
      ASSERT_TRUE(client->Save(1, state_.tensors).ok());
      ASSERT_TRUE(client->WaitDurable(1).ok());
    }
    WaitForObjectManifest("obj", 1);
    daemon_->Kill(SIGTERM);
    daemon_->Wait();
    UnlinkArenas(prefix_);
  }
  void ExpectStepOneRestoresBitExact(Client& client) {
    HostState got = state_.EmptyLike();
    absl::Status s = client.Restore(1, got.tensors);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(got.Equals(state_));
  }
  void WaitForObjectManifest(const std::string& job, uint64_t step) {
    while (!objects_->Stat(storage::ManifestKey(job, step)).ok()) usleep(10000);
  }

  // Step 1 only in the object tier: no shared memory, no local file.
  void LeaveStepOneOnlyInTheObjectTier() {
    SaveStepOneThenStopAndDropSharedMemory();
    ASSERT_TRUE(std::filesystem::remove(dir_.path() + "/root/" +
                                        storage::ShardKey("obj", 1, 0)));
  }
  // A raw OpenRestoreStream of step 1: every message, then the status.
  grpc::Status StreamStepOne(std::vector<v1::RestoreProgress>* msgs) {
    grpc::ClientContext ctx;
    v1::OpenRestoreRequest req;
    req.set_job("obj");
    req.set_step(1);
    req.set_allow_file_read(true);
    auto reader = daemon_->Stub()->OpenRestoreStream(&ctx, req);
    v1::RestoreProgress m;
    while (reader->Read(&m)) msgs->push_back(m);
    return reader->Finish();
  }
  void CloseLease(uint64_t lease) {
    grpc::ClientContext ctx;
    v1::CloseRestoreRequest close;
    close.set_job("obj");
    close.set_lease(lease);
    v1::CloseRestoreResponse closed;
    EXPECT_TRUE(daemon_->Stub()->CloseRestore(&ctx, close, &closed).ok());
  }

  // The ranged tests' state: a 600 x 8192 float tensor split by rows (150
  // rows of 4.8 MB, 5 chunks, at 4 ranks) and a 1000-float bias.
  static constexpr int64_t kSplitRows = 600, kSplitCols = 8192;
  static std::vector<Tensor> RowSplit(int rank, int world, float* rows,
                                      float* b) {
    const int64_t lo = kSplitRows * rank / world,
                  hi = kSplitRows * (rank + 1) / world;
    return std::vector<Tensor>{
        Tensor{"rows",
               DType::kFloat32,
               {hi - lo, kSplitCols},
               rows,
               Device::Host(),
               TensorLayout{{kSplitRows, kSplitCols}, {lo, 0}, ""}},
        Tensor{"b", DType::kFloat32, {1000}, b, Device::Host()}};
  }
  std::unique_ptr<Client> RankClient(const std::string& job, int rank,
                                     int world) {
    auto c = Client::Connect(OptionsFor(*daemon_, job, rank, world));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // A raw OpenRestore of step 1's saved rank `saved` of `job` for [a, b)
  // of its image (b == a: no ranges, the whole saved rank); on success,
  // `check` (if any) sees the slot's bytes [a, b) (the whole image when
  // b == a) before the lease closes.
  grpc::Status OpenRanged(
      const std::string& job, uint32_t saved, uint64_t a, uint64_t b,
      v1::OpenRestoreResponse* resp,
      const std::function<void(const std::string&)>& check = nullptr) {
    grpc::ClientContext ctx;
    v1::OpenRestoreRequest req;
    req.set_job(job);
    req.set_rank(0);
    req.set_step(1);
    req.set_saved_rank(saved);
    if (b > a) {
      req.add_range_offsets(a);
      req.add_range_lengths(b - a);
    }
    *resp = v1::OpenRestoreResponse();
    grpc::Status s = daemon_->Stub()->OpenRestore(&ctx, req, resp);
    if (!s.ok()) return s;
    if (check) {
      const uint64_t at = b > a ? a : 0;
      const uint64_t len = b > a ? b - a : resp->image_bytes();
      const std::string path = "/dev/shm" + resp->shm_name();
      const int fd = ::open(path.c_str(), O_RDONLY);
      EXPECT_GE(fd, 0) << path;
      std::string got(len, '\0');
      if (fd >= 0) {
        EXPECT_EQ(pread(fd, got.data(), got.size(),
                        static_cast<off_t>(resp->slot_offset() + at)),
                  static_cast<ssize_t>(got.size()));
        close(fd);
      }
      check(got);
    }
    grpc::ClientContext cctx;
    v1::CloseRestoreRequest close;
    close.set_job(job);
    close.set_rank(saved);
    close.set_step(1);
    close.set_lease(resp->lease());
    v1::CloseRestoreResponse closed;
    grpc::Status c = daemon_->Stub()->CloseRestore(&cctx, close, &closed);
    EXPECT_TRUE(c.ok()) << c.error_message();
    return s;
  }
  // Where the rows tensor starts in a saved rank's image.
  static uint64_t RowsOffset(const v1::OpenRestoreResponse& r) {
    for (const auto& t : r.tensors())
      if (t.name() == "rows") return t.offset();
    return uint64_t{0};
  }

  TempDir dir_;
  std::unique_ptr<S3Server> s3_;
  std::string url_;
  std::unique_ptr<storage::Backend> objects_;
  std::string prefix_ = UniqueShmPrefix();
  std::unique_ptr<DaemonProcess> daemon_;
  HostState state_ = MakeState(24 << 20, 5, 77);
};

TEST_P(ObjectTierTest, RoundTripThroughTheObjectTierIsBitExact) {
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Save(1, state_.tensors).ok());
  ASSERT_TRUE(client->WaitDurable(1).ok());  // commit tier object: uploaded
  WaitForObjectManifest("obj", 1);
  auto manifest =
      storage::ReadNodeManifest(*objects_, storage::ManifestKey("obj", 1));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->shards_size(), 1);
  const std::string key = storage::ShardKey("obj", 1, 0);
  storage::LocalBackendOptions lo;
  lo.root = dir_.path() + "/root";
  lo.remove_tmp_files = false;
  auto local = storage::NewLocalBackend(lo);
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(ReadAll(*objects_, key) == ReadAll(**local, key));
  v1::StatusResponse st = Status();
  EXPECT_EQ(st.commit_tier(), "object");
  EXPECT_EQ(st.uploaded_shards(), 1u);
  HostState got = state_.EmptyLike();
  ASSERT_TRUE(client->Restore(1, got.tensors).ok());
  EXPECT_TRUE(got.Equals(state_));
}

TEST_P(ObjectTierTest,
       RestoreFromObjectStoreAfterLocalDiskAndSharedMemoryAreGone) {
  SaveStepOneThenStopAndDropSharedMemory();
  ASSERT_TRUE(std::filesystem::remove(dir_.path() + "/root/" +
                                      storage::ShardKey("obj", 1, 0)));
  Start();
  {
    // The daemon says where it read from.
    grpc::ClientContext ctx;
    v1::OpenRestoreRequest req;
    req.set_job("obj");
    req.set_step(1);
    req.set_allow_file_read(true);
    v1::OpenRestoreResponse resp;
    grpc::Status s = daemon_->Stub()->OpenRestore(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.source(), v1::RESTORE_SOURCE_OBJECT);
    grpc::ClientContext ctx2;
    v1::CloseRestoreRequest close;
    close.set_job("obj");
    close.set_lease(resp.lease());
    v1::CloseRestoreResponse closed;
    ASSERT_TRUE(daemon_->Stub()->CloseRestore(&ctx2, close, &closed).ok());
  }
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  ExpectStepOneRestoresBitExact(*client);
}

// A load from the object tier is streamed (OpenRestoreStream): where the
// slot is first, then each tensor as its bytes land and verify, then the
// answer with its lease; the client copies each tensor as it is reported,
// and the restore is bit-exact.
TEST_P(ObjectTierTest, StreamedLoadReportsEachTensorOnceBeforeItsAnswer) {
  LeaveStepOneOnlyInTheObjectTier();
  if (HasFatalFailure()) return;
  Start();
  std::vector<v1::RestoreProgress> msgs;
  grpc::Status s = StreamStepOne(&msgs);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_GE(msgs.size(), 2u);
  EXPECT_TRUE(msgs.front().has_opened());
  ASSERT_TRUE(msgs.back().has_done());
  // The client's own check of the protocol accepts the daemon's stream,
  // and every tensor was reported once, before the answer.
  client::RestoreProgressCheck check;
  std::vector<uint32_t> fresh, all;
  for (const v1::RestoreProgress& m : msgs) {
    ASSERT_TRUE(check.Next(m, &fresh).ok()) << check.Next(m, &fresh);
    all.insert(all.end(), fresh.begin(), fresh.end());
  }
  std::sort(all.begin(), all.end());
  std::vector<uint32_t> every(state_.tensors.size());
  for (uint32_t i = 0; i < every.size(); ++i) every[i] = i;
  EXPECT_EQ(all, every);
  const v1::OpenRestoreResponse& done = msgs.back().done();
  EXPECT_EQ(done.source(), v1::RESTORE_SOURCE_OBJECT);
  EXPECT_NE(done.lease(), 0u);
  CloseLease(done.lease());
  // The step is in memory now: a restore after a restart loads it again.
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  Start();
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  ExpectStepOneRestoresBitExact(*client);
}

// A flipped byte in the object's last tensor (the last to verify): the
// tensors before it are reported, the last never is, the stream ends with
// the load's DataLoss naming the tensor and the step, no answer and no
// lease; the client's restore fails the same way and reports no success.
TEST_P(ObjectTierTest, FlippedByteInTheLastTensorFailsTheStreamedRestore) {
  LeaveStepOneOnlyInTheObjectTier();
  if (HasFatalFailure()) return;
  const std::string key = storage::ShardKey("obj", 1, 0);
  auto info = storage::ReadShardInfo(*objects_, key);
  ASSERT_TRUE(info.ok()) << info.status();
  {
    std::string bytes = ReadAll(*objects_, key);
    const storage::ShardTensor& last = info->tensors.back();
    ASSERT_EQ(bytes.size(), info->layout.image_bytes);
    bytes[last.offset + last.bytes - 1] ^= 0x20;
    auto w = objects_->NewObjectWriter(key, bytes.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  Start();
  const std::string name = state_.tensors.back().name;
  const uint32_t last = static_cast<uint32_t>(state_.tensors.size() - 1);
  std::vector<v1::RestoreProgress> msgs;
  grpc::Status s = StreamStepOne(&msgs);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find(name), std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find(key), std::string::npos)
      << s.error_message();
  ASSERT_FALSE(msgs.empty());
  EXPECT_TRUE(msgs.front().has_opened());
  size_t reported = 0;
  for (const v1::RestoreProgress& m : msgs) {
    EXPECT_FALSE(m.has_done());
    for (uint32_t t : m.verified()) {
      EXPECT_NE(t, last);
      ++reported;
    }
  }
  EXPECT_EQ(reported, state_.tensors.size() - 1);
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  HostState got = state_.EmptyLike();
  absl::Status r = client->Restore(1, got.tensors);
  EXPECT_EQ(r.code(), absl::StatusCode::kDataLoss) << r;
  EXPECT_NE(std::string(r.message()).find(name), std::string::npos) << r;
  EXPECT_NE(std::string(r.message()).find("step 1"), std::string::npos) << r;
}

// The fallback ladder's last rung with a real ckptd and the client: the
// local file rotted, and the restore of the same step comes from the
// object tier's copy, bit-exact, instead of failing.
TEST_P(ObjectTierTest, RottedLocalFileIsRestoredFromTheObjectStoreCopy) {
  SaveStepOneThenStopAndDropSharedMemory();
  const std::string local =
      dir_.path() + "/root/" + storage::ShardKey("obj", 1, 0);
  FlipFirstTensorByteOfFile(local);
  Start();
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  ExpectStepOneRestoresBitExact(*client);
  auto latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);
  // The rotted file goes; the object copy stays.
  for (int i = 0; i < 2000 && std::filesystem::exists(local); ++i)
    usleep(10000);
  EXPECT_FALSE(std::filesystem::exists(local));
  EXPECT_TRUE(objects_->Stat(storage::ShardKey("obj", 1, 0)).ok());
}

// A restore into another layout from the object tier: 4 ranks save a
// row-sharded tensor; with shared memory gone, rank 0's local file gone
// and rank 1's rotted, 3 ranks restore their rows bit-exact: rank 0's
// shard from the object tier, rank 1's from its object copy after the
// client reported the local one bad (the ladder, per saved rank).
TEST_P(ObjectTierTest, ReshardedRestoreReadsTheObjectTier) {
  constexpr int64_t kRows = 600, kCols = 512;
  std::vector<float> global(kRows * kCols);
  for (size_t i = 0; i < global.size(); ++i)
    global[i] = static_cast<float>(i) * 0.75f - 5.0f;
  auto rank_client = [&](int rank, int world) {
    auto c = Client::Connect(OptionsFor(*daemon_, "rso", rank, world));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  };
  auto piece = [&](int rank, int world, float* data) {
    const int64_t lo = kRows * rank / world, hi = kRows * (rank + 1) / world;
    return Tensor{"rows",           DType::kFloat32,
                  {hi - lo, kCols}, data,
                  Device::Host(),   TensorLayout{{kRows, kCols}, {lo, 0}, ""}};
  };
  for (int r = 0; r < 4; ++r) {
    auto c = rank_client(r, 4);
    ASSERT_NE(c, nullptr);
    std::vector<Tensor> t = {
        piece(r, 4, global.data() + kRows * r / 4 * kCols)};
    ASSERT_TRUE(c->Save(1, t).ok());
    ASSERT_TRUE(c->WaitDurable(1).ok());
  }
  WaitForObjectManifest("rso", 1);
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  ASSERT_TRUE(std::filesystem::remove(dir_.path() + "/root/" +
                                      storage::ShardKey("rso", 1, 0)));
  FlipFirstTensorByteOfFile(dir_.path() + "/root/" +
                            storage::ShardKey("rso", 1, 1));
  Start();
  for (int r = 0; r < 3; ++r) {
    auto c = rank_client(r, 3);
    ASSERT_NE(c, nullptr);
    const int64_t lo = kRows * r / 3, hi = kRows * (r + 1) / 3;
    std::vector<float> got((hi - lo) * kCols, -1.0f);
    std::vector<Tensor> t = {piece(r, 3, got.data())};
    absl::Status st = c->Restore(1, t);
    ASSERT_TRUE(st.ok()) << "rank " << r << " of 3: " << st;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), global.begin() + lo * kCols))
        << "rank " << r << " of 3";
  }
}

// A resharded restore from the object tier GETs only the chunks its rows
// touch (doc/resharding.md, "Byte ranges from storage"): 4 ranks save a
// row-sharded tensor of 5 chunks a rank and a whole one; with shared
// memory and every local file gone, a saved rank's ranges come as a
// partial slot of fewer bytes than its image, verified against the
// catalog's chunk hashes; a flipped byte in an untouched chunk does not
// matter, one in a touched chunk is refused naming it (and the whole
// rank's load then fails too); 3 ranks restore bit-exact; a step whose
// catalog records carry no chunk hashes (as an older ckptd wrote them)
// loads whole saved ranks, bit-exact.
TEST_P(ObjectTierTest, ReshardedRestoreGetsOnlyTheTouchedChunks) {
  constexpr int64_t kRows = kSplitRows, kCols = kSplitCols;
  constexpr uint64_t kMiB = 1 << 20;
  std::vector<float> global(kRows * kCols), bias(1000);
  for (size_t i = 0; i < global.size(); ++i)
    global[i] = static_cast<float>(i) * 0.25f - 7.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  auto rank_client = [&](const std::string& job, int rank, int world) {
    return RankClient(job, rank, world);
  };
  auto tensors = RowSplit;
  const std::vector<std::string> jobs = {"rng", "old"};
  for (const std::string& job : jobs) {
    for (int r = 0; r < 4; ++r) {
      auto c = rank_client(job, r, 4);
      ASSERT_NE(c, nullptr);
      ASSERT_TRUE(
          c->Save(1, tensors(r, 4, global.data() + kRows * r / 4 * kCols,
                             bias.data()))
              .ok());
      ASSERT_TRUE(c->WaitDurable(1).ok());
    }
    WaitForObjectManifest(job, 1);
  }
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  for (const std::string& job : jobs)
    for (int r = 0; r < 4; ++r)
      ASSERT_TRUE(std::filesystem::remove(dir_.path() + "/root/" +
                                          storage::ShardKey(job, 1, r)));
  {
    // Job "old": its records as a ckptd that kept no chunk hashes wrote
    // them.
    auto catalog = daemon::Catalog::Open(dir_.path() + "/root/.catalog");
    ASSERT_TRUE(catalog.ok()) << catalog.status();
    auto shards = (*catalog)->Shards("old");
    ASSERT_TRUE(shards.ok()) << shards.status();
    ASSERT_EQ(shards->size(), 4u);
    for (auto rec : *shards) {
      bool had = false;
      for (auto& t : *rec.mutable_tensors()) {
        had = had || t.chunk_hashes_size() != 0;
        t.clear_chunk_hashes();
      }
      EXPECT_TRUE(had) << "rank " << rec.rank();
      ASSERT_TRUE((*catalog)->PutShard(rec, true).ok());
    }
  }
  Start();

  auto open = [&](const std::string& job, uint32_t saved, uint64_t a,
                  uint64_t b, v1::OpenRestoreResponse* resp) {
    return OpenRanged(job, saved, a, b, resp);
  };
  auto rows_offset = RowsOffset;

  // The index alone (a range in the header touches no tensor), then 100
  // bytes of the rows: one chunk comes, with the header, index and footer.
  v1::OpenRestoreResponse r;
  grpc::Status s = open("rng", 1, 100, 200, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial());
  EXPECT_EQ(r.source(), v1::RESTORE_SOURCE_OBJECT);
  const uint64_t image = r.image_bytes(), rows = rows_offset(r);
  ASSERT_GT(rows, 0u);
  EXPECT_EQ(r.peer_bytes(), rows + 4096);
  s = open("rng", 1, rows + 10, rows + 110, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial());
  EXPECT_EQ(r.peer_bytes(), rows + kMiB + 4096);
  EXPECT_LT(r.peer_bytes(), image);
  // Ranges past the image are the caller's error.
  s = open("rng", 1, image - 10, image + 10, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("past image_bytes"), std::string::npos)
      << s.error_message();

  auto restore_at_3 = [&](const std::string& job) {
    for (int k = 0; k < 3; ++k) {
      auto c = rank_client(job, k, 3);
      ASSERT_NE(c, nullptr);
      const int64_t lo = kRows * k / 3, hi = kRows * (k + 1) / 3;
      std::vector<float> got((hi - lo) * kCols, -1.0f), b(1000, -1.0f);
      absl::Status st = c->Restore(1, tensors(k, 3, got.data(), b.data()));
      ASSERT_TRUE(st.ok()) << job << " rank " << k << " of 3: " << st;
      EXPECT_TRUE(
          std::equal(got.begin(), got.end(), global.begin() + lo * kCols))
          << job << " rank " << k << " of 3";
      EXPECT_EQ(b, bias) << job << " rank " << k << " of 3";
    }
  };

  // A byte flipped in chunk 2 of saved rank 3's rows, in the object store.
  const std::string key3 = storage::ShardKey("rng", 1, 3);
  const std::string good = ReadAll(*objects_, key3);
  ASSERT_EQ(good.size(), image);
  auto put = [&](const std::string& bytes) {
    auto w = objects_->NewObjectWriter(key3, bytes.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  };
  std::string bad = good;
  bad[rows + 2 * kMiB + 100] ^= 0x10;
  put(bad);
  ASSERT_FALSE(HasFatalFailure());
  // Chunk 0 only: the flip is not read.
  s = open("rng", 3, rows, rows + 100, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial());
  // Chunk 2: refused naming it; the whole saved rank then fails as well.
  s = open("rng", 3, rows + 2 * kMiB, rows + 2 * kMiB + 10, &r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find("tensor \"rows\" chunk 2"),
            std::string::npos)
      << s.error_message();

  // Put back: every new rank restores bit-exact (ranges touching more
  // than a third of a saved rank, as each new rank's here do, load it
  // whole, kept for the next rank).
  put(good);
  ASSERT_FALSE(HasFatalFailure());
  restore_at_3("rng");
  ASSERT_FALSE(HasFatalFailure());

  // No chunk hashes recorded: the whole saved rank, bit-exact.
  s = open("old", 1, rows + 10, rows + 110, &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(r.partial());
  EXPECT_EQ(r.source(), v1::RESTORE_SOURCE_OBJECT);
  restore_at_3("old");
}

// A lost node's saved rank (doc/resharding.md, "A lost node's saved
// rank"): node A saves 4 ranks of a row-sharded tensor (5 chunks a rank)
// and a whole one into the object tier, then goes with its memory and its
// disk; a ckptd with an empty root (another node: its catalog never
// recorded the job) knows the step only from A's node manifest in the
// store. A raw OpenRestore of part of a saved rank GETs the header, index,
// footer and the touched chunks only, verified against the chunk hashes
// the manifest keeps, bit-exact; a byte flipped in the store in a touched
// chunk is refused naming it (the whole load then fails too), in an
// untouched one does not matter; a manifest without chunk hashes (an
// older daemon's) loads the whole rank, bit-exact; 3 ranks then restore
// the step bit-exact.
TEST_P(ObjectTierTest, LostNodesSavedRankGetsOnlyTheTouchedChunks) {
  constexpr int64_t kRows = kSplitRows, kCols = kSplitCols;
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t kRowBytes = kCols * sizeof(float);
  std::vector<float> global(kRows * kCols), bias(1000);
  for (size_t i = 0; i < global.size(); ++i)
    global[i] = static_cast<float>(i) * 0.5f - 3.0f;
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(i);
  auto rank_client = [&](int rank, int world) {
    return RankClient("lost", rank, world);
  };
  auto tensors = RowSplit;
  for (int r = 0; r < 4; ++r) {
    auto c = rank_client(r, 4);
    ASSERT_NE(c, nullptr);
    ASSERT_TRUE(c->Save(1, tensors(r, 4, global.data() + kRows * r / 4 * kCols,
                                   bias.data()))
                    .ok());
    ASSERT_TRUE(c->WaitDurable(1).ok());
  }
  WaitForObjectManifest("lost", 1);
  // Node A goes: its ckptd, its shared memory, its disk.
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  std::filesystem::remove_all(dir_.path() + "/root");
  Start();
  ASSERT_FALSE(HasFatalFailure());

  auto open = [&](uint32_t saved, uint64_t a, uint64_t b,
                  v1::OpenRestoreResponse* resp,
                  const std::function<void(const std::string&)>& check) {
    return OpenRanged("lost", saved, a, b, resp, check);
  };
  auto rows_offset = RowsOffset;

  // Bytes [a, b) of saved rank `saved`'s rows piece, as saved.
  auto saved_bytes = [&](uint32_t saved, uint64_t a, uint64_t b) {
    const char* piece = reinterpret_cast<const char*>(
        global.data() + kRows * saved / 4 * kCols);
    return std::string(piece + a, piece + b);
  };

  // The header and index alone (a range in the header touches no tensor),
  // then 100 bytes of the rows: one chunk more, bit-exact.
  v1::OpenRestoreResponse r;
  grpc::Status s = open(1, 100, 200, &r, nullptr);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial()) << "peer_bytes " << r.peer_bytes();
  EXPECT_EQ(r.source(), v1::RESTORE_SOURCE_OBJECT);
  const uint64_t image = r.image_bytes(), rows = rows_offset(r);
  ASSERT_GT(rows, 0u);
  EXPECT_EQ(r.peer_bytes(), rows + 4096);
  s = open(1, rows + 3 * kRowBytes + 8, rows + 3 * kRowBytes + 108, &r,
           [&](const std::string& got) {
             EXPECT_EQ(got,
                       saved_bytes(1, 3 * kRowBytes + 8, 3 * kRowBytes + 108));
           });
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial());
  EXPECT_EQ(r.peer_bytes(), rows + kMiB + 4096);
  EXPECT_LT(r.peer_bytes(), image);
  // Ranges past the image are the caller's error.
  s = open(1, image - 10, image + 10, &r, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("past image_bytes"), std::string::npos)
      << s.error_message();

  // A byte flipped in chunk 2 of saved rank 3's rows, in the object store.
  const std::string key3 = storage::ShardKey("lost", 1, 3);
  const std::string good = ReadAll(*objects_, key3);
  ASSERT_EQ(good.size(), image);
  auto put = [&](const std::string& key, const std::string& bytes) {
    auto w = objects_->NewObjectWriter(key, bytes.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, bytes.data(), bytes.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  };
  std::string bad = good;
  bad[rows + 2 * kMiB + 100] ^= 0x10;
  put(key3, bad);
  ASSERT_FALSE(HasFatalFailure());
  // Chunk 0 only: the flip is not read.
  s = open(3, rows, rows + 100, &r, [&](const std::string& got) {
    EXPECT_EQ(got, saved_bytes(3, 0, 100));
  });
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(r.partial());
  EXPECT_EQ(r.peer_bytes(), rows + kMiB + 4096);
  // Chunk 2: refused naming it; the whole saved rank then fails as well.
  s = open(3, rows + 2 * kMiB, rows + 2 * kMiB + 10, &r, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_NE(s.error_message().find("tensor \"rows\" chunk 2"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("the whole saved rank"), std::string::npos)
      << s.error_message();
  put(key3, good);
  ASSERT_FALSE(HasFatalFailure());

  // A manifest without chunk hashes (as an older daemon wrote it): saved
  // rank 2 is loaded whole, bit-exact.
  const std::string mkey = storage::ManifestKey("lost", 1);
  const std::string mtext = ReadAll(*objects_, mkey);
  auto manifest = storage::DecodeNodeManifest(mtext, mkey);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (const auto& sh : manifest->shards())
    EXPECT_GT(sh.chunk_hashes_size(), 0) << "rank " << sh.rank();
  for (auto& sh : *manifest->mutable_shards()) sh.clear_chunk_hashes();
  put(mkey, storage::EncodeNodeManifest(*manifest));
  ASSERT_FALSE(HasFatalFailure());
  s = open(2, image - 10, image + 10, &r, nullptr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = open(2, rows + kRowBytes, rows + 2 * kRowBytes, &r,
           [&](const std::string& got) {
             EXPECT_EQ(got, saved_bytes(2, kRowBytes, 2 * kRowBytes));
           });
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(r.partial());
  // Loaded into a slot here (a PREFETCH's copy), then read from memory.
  EXPECT_EQ(r.source(), v1::RESTORE_SOURCE_MEMORY);
  EXPECT_EQ(r.image_bytes(), image);
  put(mkey, mtext);
  ASSERT_FALSE(HasFatalFailure());

  // 3 ranks restore the step bit-exact (their ranges touch more than a
  // third of each saved rank: whole loads, kept for the next rank).
  for (int k = 0; k < 3; ++k) {
    auto c = rank_client(k, 3);
    ASSERT_NE(c, nullptr);
    const int64_t lo = kRows * k / 3, hi = kRows * (k + 1) / 3;
    std::vector<float> got((hi - lo) * kCols, -1.0f), b(1000, -1.0f);
    absl::Status st = c->Restore(1, tensors(k, 3, got.data(), b.data()));
    ASSERT_TRUE(st.ok()) << "rank " << k << " of 3: " << st;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), global.begin() + lo * kCols))
        << "rank " << k << " of 3";
    EXPECT_EQ(b, bias) << "rank " << k << " of 3";
  }
}

// Figure (not run by CI: --gtest_also_run_disabled_tests
// --gtest_filter='*FigureLostRank*/s3'; CKPT_FIGURE_MIB sets the saved
// bytes, default 1024): 8 ranks save a row-sharded tensor, the node goes
// (ckptd killed, shared memory and root removed), a ckptd with an empty
// root opens each saved rank once, alternately for a third of its rows by
// ranges (RangesFromManifest) and whole (no ranges: FetchSavedRank, the
// path before), the order alternating per pair: bytes GET, time of the
// open, medians. Each open's bytes are checked against the saved ones.
TEST_P(ObjectTierTest, DISABLED_FigureLostRankRangedAgainstWhole) {
  uint64_t mib = 1024;
  if (const char* e = getenv("CKPT_FIGURE_MIB")) mib = std::stoull(e);
  constexpr int64_t kCols = 8192;  // 32 KiB a row
  constexpr int kRanks = 8;
  const int64_t rows_total = static_cast<int64_t>(mib << 20) / (kCols * 4);
  std::vector<float> global(static_cast<size_t>(rows_total * kCols));
  for (size_t i = 0; i < global.size(); ++i)
    global[i] = static_cast<float>(i % 100003) * 0.5f;
  auto piece = [&](int r, float* data) {
    const int64_t lo = rows_total * r / kRanks,
                  hi = rows_total * (r + 1) / kRanks;
    return std::vector<Tensor>{
        Tensor{"rows",
               DType::kFloat32,
               {hi - lo, kCols},
               data,
               Device::Host(),
               TensorLayout{{rows_total, kCols}, {lo, 0}, ""}}};
  };
  for (int r = 0; r < kRanks; ++r) {
    auto c = Client::Connect(OptionsFor(*daemon_, "fig", r, kRanks));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(
        (*c)->Save(1, piece(r, global.data() + rows_total * r / kRanks * kCols))
            .ok());
    ASSERT_TRUE((*c)->WaitDurable(1).ok());
  }
  WaitForObjectManifest("fig", 1);
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  std::filesystem::remove_all(dir_.path() + "/root");
  Start();
  ASSERT_FALSE(HasFatalFailure());
  // Opens saved rank `saved` (for [a, b) of its image when b > a) with
  // the fixture's OpenRanged, timing the open alone (up to the check),
  // checks the first `check` bytes of its rows it serves against the saved
  // ones; OpenRanged closes it.
  uint64_t rows_at = 0;
  auto open = [&](uint32_t saved, uint64_t a, uint64_t b, uint64_t check,
                  v1::OpenRestoreResponse* resp, double* seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    *seconds = -1;
    grpc::Status s =
        OpenRanged("fig", saved, a, b, resp, [&](const std::string& got) {
          *seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - t0)
                         .count();
          if (check == 0) return;
          // Ranged: `got` starts at the rows; whole: at the image's start.
          const uint64_t at = b > a ? 0 : rows_at;
          ASSERT_GE(got.size(), at + check);
          const char* want = reinterpret_cast<const char*>(
              global.data() + rows_total * saved / kRanks * kCols);
          EXPECT_EQ(std::memcmp(got.data() + at, want, check), 0)
              << "saved rank " << saved;
        });
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_GE(*seconds, 0);
  };
  v1::OpenRestoreResponse r;
  double t = 0;
  open(0, 100, 200, 0, &r, &t);  // the header: where the rows start
  ASSERT_FALSE(HasFatalFailure());
  for (const auto& m : r.tensors())
    if (m.name() == "rows") rows_at = m.offset();
  ASSERT_GT(rows_at, 0u);
  std::vector<double> ranged_s, whole_s, ranged_b, whole_b;
  for (int pair = 0; pair < kRanks / 2; ++pair) {
    for (int k = 0; k < 2; ++k) {
      const uint32_t saved = static_cast<uint32_t>(2 * pair + k);
      const bool ranged = (k == 0) == (pair % 2 == 0);
      const uint64_t rank_rows = static_cast<uint64_t>(
          rows_total * (saved + 1) / kRanks - rows_total * saved / kRanks);
      // A third of its rows' bytes, rounded down to whole chunks.
      const uint64_t third = rank_rows * kCols * 4 / 3 / (1 << 20) * (1 << 20);
      open(saved, ranged ? rows_at : 0, ranged ? rows_at + third : 0,
           ranged ? third : rank_rows * kCols * 4, &r, &t);
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_EQ(r.partial(), ranged) << "saved rank " << saved;
      (ranged ? ranged_s : whole_s).push_back(t);
      (ranged ? ranged_b : whole_b)
          .push_back(
              static_cast<double>(ranged ? r.peer_bytes() : r.image_bytes()));
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  std::string load;
  {
    std::ifstream f("/proc/loadavg");
    std::getline(f, load);
  }
  std::printf(
      "FIGURE lost rank, %s, %llu MiB saved at 8: whole %.0f B %.4f s, "
      "ranged (a third) %.0f B %.4f s; ratio bytes %.3f time %.3f; "
      "%zu opens each; loadavg %s\n",
      GetParam().c_str(), static_cast<unsigned long long>(mib), median(whole_b),
      median(whole_s), median(ranged_b), median(ranged_s),
      median(ranged_b) / median(whole_b), median(ranged_s) / median(whole_s),
      ranged_s.size(), load.c_str());
  for (size_t i = 0; i < ranged_s.size(); ++i)
    std::printf("  pair %zu: whole %.4f s, ranged %.4f s\n", i, whole_s[i],
                ranged_s[i]);
  EXPECT_LT(median(ranged_b), median(whole_b) / 2);
}

// While a restore's client copies out of the arena a load created (its
// lease open), the prefaulter leaves the arena's other slots alone
// (prefaulter.h): zeroing them would take the CPU the copy needs. For at
// most EngineOptions::prefault_read_hold (2 s) from the lease's opening: a
// lease left open does not keep them back longer, and a save after the
// restore finds its slot ready. Before the hold, slot 1 was readied as
// soon as the load's read ended, while the client still copied.
class ObjectTierPrefaultTest : public ObjectTierTest {};
TEST_P(ObjectTierPrefaultTest,
       OpenRestoreLeaseHoldsOtherSlotsBackForAtMostTheBound) {
  LeaveStepOneOnlyInTheObjectTier();
  if (HasFatalFailure()) return;
  Start();
  const auto before_open = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  v1::OpenRestoreRequest req;
  req.set_job("obj");
  req.set_step(1);
  v1::OpenRestoreResponse resp;
  grpc::Status s = daemon_->Stub()->OpenRestore(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.source(), v1::RESTORE_SOURCE_OBJECT);
  auto view =
      shm::Arena::Attach(resp.shm_name(), resp.arena_bytes(), shm::kSlotAlign);
  ASSERT_TRUE(view.ok()) << view.status();
  const auto* h = reinterpret_cast<const shm::ArenaHeader*>((*view)->base());
  ASSERT_GE(h->num_slots, 2u);
  ASSERT_EQ(resp.slot_offset(), h->slots_offset);  // the load took slot 0
  // Slot 1 is ready once its pages are allocated in the segment (the load
  // reserved slot 0 and the header only).
  const std::string path = "/dev/shm" + resp.shm_name();
  const uint64_t all_slots = h->slots_offset + h->num_slots * h->slot_bytes;
  auto slots_ready = [&] {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 &&
           uint64_t(st.st_blocks) * 512 >= all_slots;
  };
  // The lease stays open: the bound, not the lease, releases the slots.
  ASSERT_TRUE(Eventually(slots_ready)) << path;
  const double held_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - before_open)
                            .count();
  EXPECT_GE(held_s, 2.0) << "slot 1 readied beside the client's copy";
  CloseLease(resp.lease());
  // The next save goes into slot 1 (slot 0 holds the newest step).
  auto client = Connect("obj");
  ASSERT_NE(client, nullptr);
  HostState next = MakeState(24 << 20, 5, 78);
  ASSERT_TRUE(client->Save(2, next.tensors).ok());
  EXPECT_EQ(h->slots[1].step.load(), 2u);
  ExpectStepOneRestoresBitExact(*client);
}

INSTANTIATE_TEST_SUITE_P(Stores, ObjectTierTest, ::testing::Values("dir", "s3"),
                         [](const auto& info) { return info.param; });
// The store plays no part in the prefaulter's hold: a directory only.
INSTANTIATE_TEST_SUITE_P(Stores, ObjectTierPrefaultTest,
                         ::testing::Values("dir"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ckpt::testing
