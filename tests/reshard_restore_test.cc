// Restore into another layout through a real ckptd (doc/resharding.md,
// "Restore into another layout"): 4 ranks save a row-sharded tensor, a 2-D
// block-sharded one and a whole one; ranks of another world size restore
// their own pieces from the step's layout index, from memory and after a
// daemon restart (disk), bit-exact against the global tensors.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "ckpt/ckpt.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "tests/daemon_test.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

// "rows" float32 [kRows, kCols], saved rows [750 r, 750 (r + 1)) by rank r:
// 3 MB pieces, so reads cross 1 MiB checksum chunks inside a piece.
constexpr int64_t kRows = 3000, kCols = 1000;
// "blocks" int32 [kBR, kBC], saved as 2 x 2 blocks.
constexpr int64_t kBR = 64, kBC = 96;
constexpr int kSaved = 4;

// [n r / m, n (r + 1) / m): an uneven split is fine.
std::pair<int64_t, int64_t> Split(int64_t n, int m, int r) {
  return {n * r / m, n * (r + 1) / m};
}

struct Global {
  std::vector<float> rows = std::vector<float>(kRows * kCols);
  std::vector<int32_t> blocks = std::vector<int32_t>(kBR * kBC);
  std::vector<double> whole = {1.5, -2.25, 3.0, 1e300, -0.0};
  Global() {
    for (size_t i = 0; i < rows.size(); ++i)
      rows[i] = static_cast<float>(i % 999983) * 0.5f + 0.25f;
    std::iota(blocks.begin(), blocks.end(), -1000);
  }
};

// One rank's buffers and the tensors naming them.
struct RankState {
  std::vector<float> rows;
  std::vector<int32_t> blocks;
  std::vector<double> whole = std::vector<double>(5, -7.0);
  std::vector<Tensor> tensors;
};

// Saved rank r of kSaved: rows band r, block (r / 2, r % 2), the whole.
RankState SavedRank(const Global& g, int r) {
  RankState s;
  auto [lo, hi] = Split(kRows, kSaved, r);
  s.rows.assign(g.rows.begin() + lo * kCols, g.rows.begin() + hi * kCols);
  const int64_t br = kBR / 2, bc = kBC / 2, r0 = (r / 2) * br,
                c0 = (r % 2) * bc;
  for (int64_t i = 0; i < br; ++i)
    for (int64_t j = 0; j < bc; ++j)
      s.blocks.push_back(g.blocks[(r0 + i) * kBC + c0 + j]);
  s.whole = g.whole;
  s.tensors = {
      {"rows",
       DType::kFloat32,
       {hi - lo, kCols},
       s.rows.data(),
       Device::Host(),
       TensorLayout{{kRows, kCols}, {lo, 0}, ""}},
      {"blocks",
       DType::kInt32,
       {br, bc},
       s.blocks.data(),
       Device::Host(),
       TensorLayout{{kBR, kBC}, {r0, c0}, ""}},
      {"whole",
       DType::kFloat64,
       {5},
       s.whole.data(),
       Device::Host(),
       std::nullopt},
  };
  return s;
}

// Rank r of m asks: rows band r, blocks as rows (band r of kBR), the whole.
RankState Asked(int m, int r) {
  RankState s;
  auto [lo, hi] = Split(kRows, m, r);
  auto [blo, bhi] = Split(kBR, m, r);
  s.rows.assign((hi - lo) * kCols, -1.0f);
  s.blocks.assign((bhi - blo) * kBC, -1);
  s.tensors = {
      {"rows",
       DType::kFloat32,
       {hi - lo, kCols},
       s.rows.data(),
       Device::Host(),
       TensorLayout{{kRows, kCols}, {lo, 0}, ""}},
      {"blocks",
       DType::kInt32,
       {bhi - blo, kBC},
       s.blocks.data(),
       Device::Host(),
       TensorLayout{{kBR, kBC}, {blo, 0}, ""}},
      {"whole",
       DType::kFloat64,
       {5},
       s.whole.data(),
       Device::Host(),
       std::nullopt},
  };
  return s;
}

void ExpectAsked(const Global& g, const RankState& s, int m, int r,
                 const std::string& where) {
  auto [lo, hi] = Split(kRows, m, r);
  auto [blo, bhi] = Split(kBR, m, r);
  EXPECT_EQ(0, std::memcmp(s.rows.data(), g.rows.data() + lo * kCols,
                           s.rows.size() * sizeof(float)))
      << where << ": rows of rank " << r << " of " << m;
  EXPECT_EQ(0, std::memcmp(s.blocks.data(), g.blocks.data() + blo * kBC,
                           s.blocks.size() * sizeof(int32_t)))
      << where << ": blocks of rank " << r << " of " << m;
  EXPECT_EQ(0, std::memcmp(s.whole.data(), g.whole.data(),
                           g.whole.size() * sizeof(double)))
      << where << ": whole of rank " << r << " of " << m;
}

class ReshardRestoreTest : public DaemonTest {
 protected:
  // kSaved ranks save step 1 and wait until it is durable.
  void SaveStep(const std::string& job, const Global& g) {
    for (int r = 0; r < kSaved; ++r) {
      auto c = Connect(job, r, kSaved);
      ASSERT_NE(c, nullptr);
      RankState s = SavedRank(g, r);
      ASSERT_TRUE(c->Save(1, s.tensors).ok());
      ASSERT_TRUE(c->WaitDurable(1).ok());
    }
  }
  void RestoreAt(const std::string& job, const Global& g, int m,
                 const std::string& where) {
    for (int r = 0; r < m; ++r) {
      auto c = Connect(job, r, m);
      ASSERT_NE(c, nullptr);
      RankState s = Asked(m, r);
      std::vector<std::optional<TensorLayout>> layouts;
      absl::Status st = c->Restore(1, s.tensors, &layouts);
      ASSERT_TRUE(st.ok()) << where << " rank " << r << " of " << m << ": "
                           << st;
      ExpectAsked(g, s, m, r, where);
      ASSERT_EQ(layouts.size(), 3u);
      EXPECT_EQ(layouts[0], s.tensors[0].layout) << where;
      EXPECT_EQ(layouts[2], std::nullopt) << where;
    }
  }
  void StopAndDropMemory() {
    daemon_->Kill(SIGTERM);
    daemon_->Wait();
    UnlinkArenas(prefix_);
  }
};

TEST_F(ReshardRestoreTest, At3And6RanksFromMemoryAndAfterARestart) {
  Global g;
  SaveStep("rs", g);
  RestoreAt("rs", g, 3, "memory");
  RestoreAt("rs", g, 6, "memory");
  RestoreAt("rs", g, 2, "memory");
  // One rank asks for every tensor whole, without a layout.
  {
    auto c = Connect("rs", 0, 1);
    ASSERT_NE(c, nullptr);
    std::vector<float> rows(kRows * kCols, -1.0f);
    std::vector<int32_t> blocks(kBR * kBC, -1);
    std::vector<Tensor> t = {{"rows",
                              DType::kFloat32,
                              {kRows, kCols},
                              rows.data(),
                              Device::Host(),
                              std::nullopt},
                             {"blocks",
                              DType::kInt32,
                              {kBR, kBC},
                              blocks.data(),
                              Device::Host(),
                              std::nullopt}};
    absl::Status st = c->Restore(1, t);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(rows, g.rows);
    EXPECT_EQ(blocks, g.blocks);
    // Every saved piece of both tensors read once: exactly their bytes,
    // from every saved rank.
    const RestoreStats stats = c->last_restore_stats();
    EXPECT_TRUE(stats.resharded);
    EXPECT_EQ(stats.bytes,
              static_cast<uint64_t>((kRows * kCols + kBR * kBC) * 4));
    EXPECT_EQ(stats.bytes_read, stats.bytes);
    EXPECT_EQ(stats.saved_ranks, static_cast<uint32_t>(kSaved));
  }
  // The same layout still restores on its own path.
  RestoreAt("rs", g, kSaved, "same layout");

  StopAndDropMemory();
  Restart();
  RestoreAt("rs", g, 3, "disk");
  RestoreAt("rs", g, 6, "disk");
}

TEST_F(ReshardRestoreTest, AFlippedByteInASavedPieceIsCaughtAndNamed) {
  Global g;
  SaveStep("flip", g);
  StopAndDropMemory();
  // Flip one byte of saved rank 1's "rows" piece in its shard file.
  const std::string path = root() + "/" + storage::ShardKey("flip", 1, 1);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> image((std::istreambuf_iterator<char>(f)),
                          std::istreambuf_iterator<char>());
  absl::StatusOr<storage::ShardHeader> h = storage::DecodeHeader(image);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<storage::ShardInfo> info = storage::DecodeShardMetadata(
      image, std::span<const char>(image).subspan(h->footer_offset),
      image.size());
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->tensors[0].name, "rows");
  // In chunk 2 (bytes [2 MiB, 3 MiB) of the 3 MB piece: rows 1274 to 1500).
  const uint64_t at = info->tensors[0].offset + 2500000;
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(image[at] ^ 0x10));
  f.close();
  Restart();
  // Rank 0 of 3 reads rows [750, 1000) of saved rank 1: chunk 0 only, which
  // verifies against its own hash, so the restore is good.
  {
    auto c = Connect("flip", 0, 3);
    ASSERT_NE(c, nullptr);
    RankState s = Asked(3, 0);
    absl::Status st = c->Restore(1, s.tensors);
    ASSERT_TRUE(st.ok()) << st;
    ExpectAsked(g, s, 3, 0, "beside a flipped chunk");
  }
  // Rank 1 of 3 reads rows [1000, 2000): chunk 2 of saved rank 1 too.
  auto c = Connect("flip", 1, 3);
  ASSERT_NE(c, nullptr);
  RankState s = Asked(3, 1);
  absl::Status st = c->Restore(1, s.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("tensor \"rows\" of saved rank 1: checksum "
                              "mismatch in chunk 2"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("partly written"), std::string::npos) << st;
}

// From a shard file into 4 KiB-aligned tensors of 4 KiB rows: the chunks
// that lie whole inside a run are read straight into the tensor (O_DIRECT,
// several in flight) and hashed there, the others land in the bounce
// buffers and are copied out. "wide" float32 [4096, 1024] (16 MiB), saved
// 4-way (4 MiB pieces, 4 chunks each), restored 3-way after a restart.
class AlignedRows {
 public:
  static constexpr int64_t kRows = 4096, kCols = 1024;
  AlignedRows(int64_t lo, int64_t hi)
      : lo_(lo),
        hi_(hi),
        p_(static_cast<float*>(std::aligned_alloc(
            4096,
            static_cast<size_t>(std::max<int64_t>(hi - lo, 1) * kCols * 4)))) {}
  ~AlignedRows() { std::free(p_); }
  AlignedRows(const AlignedRows&) = delete;
  AlignedRows& operator=(const AlignedRows&) = delete;
  static float Value(int64_t i) {
    return static_cast<float>(i % 1000003) * 0.25f - 7.0f;
  }
  void Fill(float v) { std::fill(p_, p_ + (hi_ - lo_) * kCols, v); }
  void FillGlobal() {
    for (int64_t i = 0; i < (hi_ - lo_) * kCols; ++i)
      p_[i] = Value(lo_ * kCols + i);
  }
  bool HoldsGlobal() const {
    for (int64_t i = 0; i < (hi_ - lo_) * kCols; ++i) {
      const float want = Value(lo_ * kCols + i);
      if (std::memcmp(&p_[i], &want, sizeof want) != 0) return false;
    }
    return true;
  }
  std::vector<Tensor> Tensors() const {
    return {{"wide",
             DType::kFloat32,
             {hi_ - lo_, kCols},
             p_,
             Device::Host(),
             TensorLayout{{kRows, kCols}, {lo_, 0}, ""}}};
  }

 private:
  int64_t lo_, hi_;
  float* p_;
};

TEST_F(ReshardRestoreTest, FromTheFileChunksAreReadStraightInAndVerified) {
  for (int r = 0; r < kSaved; ++r) {
    auto c = Connect("wide", r, kSaved);
    ASSERT_NE(c, nullptr);
    auto [lo, hi] = Split(AlignedRows::kRows, kSaved, r);
    AlignedRows a(lo, hi);
    a.FillGlobal();
    ASSERT_TRUE(c->Save(1, a.Tensors()).ok());
    ASSERT_TRUE(c->WaitDurable(1).ok());
  }
  StopAndDropMemory();
  Restart();
  for (int r = 0; r < 3; ++r) {
    auto c = Connect("wide", r, 3);
    ASSERT_NE(c, nullptr);
    auto [lo, hi] = Split(AlignedRows::kRows, 3, r);
    AlignedRows a(lo, hi);
    a.Fill(-1.0f);
    absl::Status st = c->Restore(1, a.Tensors());
    ASSERT_TRUE(st.ok()) << "rank " << r << " of 3: " << st;
    EXPECT_TRUE(a.HoldsGlobal()) << "rank " << r << " of 3";
  }
  // A flipped byte in chunk 2 of saved rank 1's piece (rows [1024, 2048)):
  // rank 1 of 3 (rows [1365, 2730)) reads chunks 2 and 3 straight into its
  // tensor and names the chunk; rank 0 (rows [0, 1365)) reads chunks 0
  // and 1 only and is unaffected.
  StopAndDropMemory();
  const std::string path = root() + "/" + storage::ShardKey("wide", 1, 1);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    std::vector<char> image((std::istreambuf_iterator<char>(f)),
                            std::istreambuf_iterator<char>());
    absl::StatusOr<storage::ShardHeader> h = storage::DecodeHeader(image);
    ASSERT_TRUE(h.ok()) << h.status();
    absl::StatusOr<storage::ShardInfo> info = storage::DecodeShardMetadata(
        image, std::span<const char>(image).subspan(h->footer_offset),
        image.size());
    ASSERT_TRUE(info.ok()) << info.status();
    const uint64_t at = info->tensors[0].offset + 2 * kChecksumChunk + 12345;
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(image[at] ^ 0x01));
  }
  Restart();
  {
    auto c = Connect("wide", 0, 3);
    ASSERT_NE(c, nullptr);
    auto [lo, hi] = Split(AlignedRows::kRows, 3, 0);
    AlignedRows a(lo, hi);
    a.Fill(-1.0f);
    absl::Status st = c->Restore(1, a.Tensors());
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(a.HoldsGlobal());
  }
  {
    auto c = Connect("wide", 1, 3);
    ASSERT_NE(c, nullptr);
    auto [lo, hi] = Split(AlignedRows::kRows, 3, 1);
    AlignedRows a(lo, hi);
    absl::Status st = c->Restore(1, a.Tensors());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("tensor \"wide\" of saved rank 1: checksum "
                                "mismatch in chunk 2"),
              std::string::npos)
        << st;
  }
  // Saved rank 3's file cut short while the daemon runs: rank 2 of 3 reads
  // saved rank 2, then 3, whose file the daemon finds short (it checks the
  // size before it names a file); the refusal names the file and its size.
  const std::string key3 = storage::ShardKey("wide", 1, 3);
  const std::string path3 = root() + "/" + key3;
  const uintmax_t full = std::filesystem::file_size(path3);
  std::filesystem::resize_file(path3, full - 4096);
  {
    auto c = Connect("wide", 2, 3);
    ASSERT_NE(c, nullptr);
    auto [lo, hi] = Split(AlignedRows::kRows, 3, 2);
    AlignedRows a(lo, hi);
    absl::Status st = c->Restore(1, a.Tensors());
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("saved rank 3"), std::string::npos) << st;
    EXPECT_NE(
        st.message().find(absl::StrCat(key3, ": ", full - 4096, " bytes")),
        std::string::npos)
        << st;
  }
}

TEST_F(ReshardRestoreTest, ARegionNoSavedPieceHoldsIsRefusedAndChangesNothing) {
  // "gappy" [8, 4]: rank r saves row 2 r only; odd rows are in no piece.
  std::vector<std::vector<float>> rows(kSaved);
  for (int r = 0; r < kSaved; ++r) {
    auto c = Connect("gap", r, kSaved);
    ASSERT_NE(c, nullptr);
    rows[r].assign(4, static_cast<float>(r));
    // And a whole tensor of its own, another shape on every rank (a
    // per-rank state): no global tensor, left out of the index.
    std::vector<Tensor> t = {{"gappy",
                              DType::kFloat32,
                              {1, 4},
                              rows[r].data(),
                              Device::Host(),
                              TensorLayout{{8, 4}, {2 * r, 0}, ""}},
                             {"own",
                              DType::kFloat32,
                              {r + 1},
                              rows[r].data(),
                              Device::Host(),
                              std::nullopt}};
    ASSERT_TRUE(c->Save(1, t).ok());
  }
  // Rank 0 of 2 asks rows [0, 4) and a row that exists: both untouched.
  auto c = Connect("gap", 0, 2);
  ASSERT_NE(c, nullptr);
  std::vector<float> want(16, -3.0f), held(4, -3.0f);
  std::vector<Tensor> t = {{"gappy",
                            DType::kFloat32,
                            {1, 4},
                            held.data(),
                            Device::Host(),
                            TensorLayout{{8, 4}, {2, 0}, ""}},
                           {"gappy",
                            DType::kFloat32,
                            {4, 4},
                            want.data(),
                            Device::Host(),
                            TensorLayout{{8, 4}, {0, 0}, ""}}};
  t[0].name = "gappy.row2";
  t[0].layout->global_name = "gappy";
  absl::Status st = c->Restore(1, t);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("tensor \"gappy\": region offsets [1, 0] "
                              "lengths [1, 4] asked by rank 0 is in no saved "
                              "piece"),
            std::string::npos)
      << st;
  EXPECT_EQ(want, std::vector<float>(16, -3.0f));
  EXPECT_EQ(held, std::vector<float>(4, -3.0f));
  // The row that exists restores alone.
  std::vector<Tensor> one = {t[0]};
  st = c->Restore(1, one);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(held, std::vector<float>(4, 1.0f));
}

// The C API's ckpt_restore_layout takes the same path: rank 1 of 3 asks
// its rows band, and the saved layout it reports is the place filled.
TEST_F(ReshardRestoreTest, CApiRestoresIntoAnotherLayout) {
  Global g;
  SaveStep("capi", g);
  ckpt_options o;
  ckpt_options_init(&o);
  const std::string socket = daemon_->socket();
  o.socket_path = socket.c_str();
  o.job = "capi";
  o.rank = 1;
  o.world_size = 3;
  ckpt_client* c = nullptr;
  ASSERT_EQ(ckpt_connect(&o, &c), CKPT_OK) << ckpt_last_error();
  auto [lo, hi] = Split(kRows, 3, 1);
  std::vector<float> rows((hi - lo) * kCols, -1.0f);
  const int64_t shape[] = {hi - lo, kCols}, global[] = {kRows, kCols},
                offsets[] = {lo, 0};
  const ckpt_tensor t[] = {{"rows", CKPT_FLOAT32, 2, shape, rows.data(), -1}};
  const ckpt_tensor_layout l[] = {{global, offsets, nullptr}};
  ckpt_saved_layout saved[1];
  ASSERT_EQ(ckpt_restore_layout(c, 1, t, l, 1, saved), CKPT_OK)
      << ckpt_last_error();
  EXPECT_EQ(0, std::memcmp(rows.data(), g.rows.data() + lo * kCols,
                           rows.size() * sizeof(float)));
  EXPECT_EQ(saved[0].has_layout, 1);
  EXPECT_EQ(saved[0].offsets[0], lo);
  EXPECT_EQ(saved[0].global_shape[0], kRows);
  // A place outside the global tensor: refused before any byte moves.
  const int64_t outside[] = {kRows - 1, 0};
  const ckpt_tensor_layout bad[] = {{global, outside, nullptr}};
  std::fill(rows.begin(), rows.end(), -1.0f);
  EXPECT_EQ(ckpt_restore_layout(c, 1, t, bad, 1, nullptr),
            CKPT_INVALID_ARGUMENT)
      << ckpt_last_error();
  EXPECT_NE(std::string(ckpt_last_error()).find("exceed"), std::string::npos)
      << ckpt_last_error();
  EXPECT_EQ(rows, std::vector<float>(rows.size(), -1.0f));
  ckpt_close(c);
}

// The step's index merges this daemon's ranks with the pieces other nodes'
// manifests list (a shared root): ranks 0 and 1 saved here, ranks 2 and 3
// described by a MANIFEST.nodeb beside them. Without it, or with a bad
// one, the index is refused naming what is missing or wrong.
TEST_F(ReshardRestoreTest,
       TheIndexMergesOtherNodesManifestsAndNamesMissingRanks) {
  Global g;
  for (int r = 0; r < 2; ++r) {
    auto c = Connect("merged", r, kSaved);
    ASSERT_NE(c, nullptr);
    RankState s = SavedRank(g, r);
    ASSERT_TRUE(c->Save(1, s.tensors).ok());
  }
  auto ask = [&](v1::LayoutIndexResponse* resp) {
    grpc::ClientContext ctx;
    v1::LayoutIndexRequest req;
    req.set_job("merged");
    req.set_step(1);
    return daemon_->Stub()->LayoutIndex(&ctx, req, resp);
  };
  v1::LayoutIndexResponse resp;
  grpc::Status gs = ask(&resp);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(gs.error_message().find("saved ranks [2, 3] of 4 are described "
                                    "by no shard here and no node manifest"),
            std::string::npos)
      << gs.error_message();

  // Node "nodeb"'s manifest of ranks 2 and 3, as its ckptd writes it.
  std::vector<std::vector<v1::TensorMeta>> metas(kSaved);
  storage::v1::NodeManifest m;
  m.set_job("merged");
  m.set_step(1);
  m.set_world_size(kSaved);
  for (int r = 2; r < 4; ++r) {
    RankState s = SavedRank(g, r);
    uint64_t offset = 1 << 20;
    for (const Tensor& t : s.tensors) {
      v1::TensorMeta& tm = metas[r].emplace_back();
      tm.set_name(t.name);
      tm.set_dtype(static_cast<uint32_t>(t.dtype));
      for (int64_t d : t.shape) tm.add_shape(static_cast<uint64_t>(d));
      tm.set_offset(offset);
      tm.set_bytes(*t.bytes());
      offset += (*t.bytes() + 4095) / 4096 * 4096;
      if (t.layout) {
        for (int64_t d : t.layout->global_shape) tm.add_global_shape(d);
        for (int64_t d : t.layout->offsets) tm.add_piece_offsets(d);
      }
    }
    storage::v1::NodeManifestShard* ms = m.add_shards();
    ms->set_rank(r);
    ms->set_key(storage::ShardKey("merged", 1, r, "nodeb"));
    ms->set_bytes(offset);
    ms->set_tensors(3);
    ms->set_checksums_digest("0000000000000000");
  }
  absl::StatusOr<storage::LayoutIndex> theirs =
      storage::BuildLayoutIndex(kSaved, metas);
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  m.set_layout_index(storage::SerializeLayoutIndex(*theirs));
  storage::LocalBackendOptions lo;
  lo.root = root();
  auto local = storage::NewLocalBackend(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(storage::WriteNodeManifest(**local, m, "nodeb").ok());

  gs = ask(&resp);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_EQ(resp.world_size(), 4u);
  EXPECT_EQ(std::vector<uint32_t>(resp.local_ranks().begin(),
                                  resp.local_ranks().end()),
            (std::vector<uint32_t>{0, 1}));
  absl::StatusOr<storage::LayoutIndex> index =
      storage::ParseLayoutIndex(resp.index());
  ASSERT_TRUE(index.ok()) << index.status();
  const int64_t rows = index->FindTensor("rows");
  ASSERT_GE(rows, 0);
  const storage::LayoutTensor& rt = index->tensors()[rows];
  ASSERT_EQ(rt.num_pieces, 4u);
  for (uint64_t p = rt.first_piece; p < rt.first_piece + 4; ++p) {
    auto [lo_row, hi_row] = Split(kRows, kSaved, index->piece_rank(p));
    EXPECT_EQ(index->PieceBox(p).ToString(),
              absl::StrCat("offsets [", lo_row, ", 0] lengths [",
                           hi_row - lo_row, ", ", kCols, "]"));
  }
  EXPECT_EQ(index->tensors()[index->FindTensor("whole")].num_pieces, 4u);
  // A restore that needs ranks 2 and 3: this ckptd tries to load them from
  // the keys the manifest names, which hold nothing: refused naming the
  // first, and nothing is written.
  {
    auto c = Connect("merged", 0, 1);
    ASSERT_NE(c, nullptr);
    std::vector<float> rows(kRows * kCols, -1.0f);
    std::vector<Tensor> t = {{"rows",
                              DType::kFloat32,
                              {kRows, kCols},
                              rows.data(),
                              Device::Host(),
                              std::nullopt}};
    absl::Status st = c->Restore(1, t);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("saved rank 2 holds pieces asked for, is "
                                "not on this node, and this node's ckptd "
                                "could not load it"),
              std::string::npos)
        << st;
    EXPECT_EQ(rows, std::vector<float>(kRows * kCols, -1.0f));
  }

  // A manifest that does not parse is named, not skipped.
  ASSERT_TRUE((*local)
                  ->PutSmallObject(storage::ManifestKey("merged", 1, "nodeb"),
                                   "{\"format\": 7")
                  .ok());
  gs = ask(&resp);
  EXPECT_EQ(gs.error_code(), grpc::StatusCode::DATA_LOSS) << gs.error_message();
  EXPECT_NE(gs.error_message().find("MANIFEST.nodeb"), std::string::npos)
      << gs.error_message();
}

// A step number saved twice: by an abandoned timeline at world size 4
// (rank 2, generation 1), then by the job resized to 2 ranks (generation
// 2), as a job that shrank and saves again does. The step is the newer
// generation's: the index leaves the older shard of another world size
// out, where it used to refuse the mix, and a restore at 3 ranks reads the
// two ranks of the newer timeline.
TEST_F(ReshardRestoreTest, AStepSavedAgainAtAnotherWorldSizeIsTheNewerOnes) {
  Global g;
  {
    ClientOptions o = OptionsFor(*daemon_, "again", 2, kSaved);
    o.generation = 1;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    RankState s = SavedRank(g, 2);
    ASSERT_TRUE((*c)->Save(8, s.tensors).ok());
  }
  std::vector<RankState> saved;
  for (int r = 0; r < 2; ++r) {
    ClientOptions o = OptionsFor(*daemon_, "again", r, 2);
    o.generation = 2;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    RankState s = Asked(2, r);
    auto [lo, hi] = Split(kRows, 2, r);
    std::copy(g.rows.begin() + lo * kCols, g.rows.begin() + hi * kCols,
              s.rows.begin());
    ASSERT_TRUE((*c)->Save(8, s.tensors).ok());
  }
  grpc::ClientContext ctx;
  v1::LayoutIndexRequest req;
  req.set_job("again");
  req.set_step(8);
  v1::LayoutIndexResponse resp;
  grpc::Status gs = daemon_->Stub()->LayoutIndex(&ctx, req, &resp);
  ASSERT_TRUE(gs.ok()) << gs.error_message();
  EXPECT_EQ(resp.world_size(), 2u);
  EXPECT_EQ(std::vector<uint32_t>(resp.local_ranks().begin(),
                                  resp.local_ranks().end()),
            (std::vector<uint32_t>{0, 1}));
  ClientOptions o = OptionsFor(*daemon_, "again", 1, 3);
  o.generation = 3;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  RankState s = Asked(3, 1);
  std::vector<Tensor> rows = {s.tensors[0]};
  absl::Status st = (*c)->Restore(8, rows);
  ASSERT_TRUE(st.ok()) << st;
  auto [lo, hi] = Split(kRows, 3, 1);
  EXPECT_TRUE(
      std::equal(s.rows.begin(), s.rows.end(), g.rows.begin() + lo * kCols));
}

}  // namespace
}  // namespace ckpt::testing
