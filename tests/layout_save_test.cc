// Tensors saved as pieces of global tensors (doc/resharding.md) through a
// real ckptd: the layout is validated at the commit, recorded in the shard
// (a version-2 shard on disk), and reported back by every restore.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>

#include "ckpt/ckpt.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "tests/await_file.h"
#include "tests/daemon_test.h"

namespace ckpt::testing {
namespace {

class LayoutSaveTest : public DaemonTest {};

// Rank 0 of 1 holds rows [0, 2) and [4, 6) of a global "w" [8, 4] as two
// pieces, and a whole "b".
struct PieceState {
  std::vector<float> w0 = std::vector<float>(8), w1 = std::vector<float>(8),
                     b = std::vector<float>(3);
  std::vector<Tensor> tensors;
  explicit PieceState(float base) {
    std::iota(w0.begin(), w0.end(), base);
    std::iota(w1.begin(), w1.end(), base + 100);
    std::iota(b.begin(), b.end(), base + 200);
    tensors = {
        {"w.0",
         DType::kFloat32,
         {2, 4},
         w0.data(),
         Device::Host(),
         TensorLayout{{8, 4}, {0, 0}, "w"}},
        {"w.1",
         DType::kFloat32,
         {2, 4},
         w1.data(),
         Device::Host(),
         TensorLayout{{8, 4}, {4, 0}, "w"}},
        {"b", DType::kFloat32, {3}, b.data(), Device::Host(), std::nullopt},
    };
  }
};

void ExpectSavedLayouts(const std::vector<std::optional<TensorLayout>>& got,
                        const PieceState& s, const std::string& where) {
  ASSERT_EQ(got.size(), 3u) << where;
  EXPECT_EQ(got[0], s.tensors[0].layout) << where;
  EXPECT_EQ(got[1], s.tensors[1].layout) << where;
  EXPECT_EQ(got[2], std::nullopt) << where;
}

TEST_F(LayoutSaveTest, LayoutIsRecordedInTheShardAndReportedByRestores) {
  auto client = Connect("pieces");
  ASSERT_NE(client, nullptr);
  PieceState saved(1);
  ASSERT_TRUE(client->Save(1, saved.tensors).ok());

  PieceState got(-1000);
  std::vector<std::optional<TensorLayout>> layouts;
  absl::Status st = client->Restore(1, got.tensors, &layouts);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(got.w0, saved.w0);
  EXPECT_EQ(got.w1, saved.w1);
  EXPECT_EQ(got.b, saved.b);
  ExpectSavedLayouts(layouts, saved, "from memory");

  // On disk: a version-2 shard whose index carries the layout.
  ASSERT_TRUE(client->WaitDurable(1).ok());
  std::ifstream f(root() + "/" + storage::ShardKey("pieces", 1, 0),
                  std::ios::binary);
  std::vector<char> image((std::istreambuf_iterator<char>(f)),
                          std::istreambuf_iterator<char>());
  absl::StatusOr<storage::ShardHeader> h = storage::DecodeHeader(image);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->version, storage::kShardVersionLayout);
  absl::StatusOr<storage::ShardInfo> info = storage::DecodeShardMetadata(
      image, std::span<const char>(image).subspan(h->footer_offset),
      image.size());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensors[1].piece_offsets, (std::vector<uint64_t>{4, 0}));
  EXPECT_EQ(info->tensors[1].global_shape, (std::vector<uint64_t>{8, 4}));
  EXPECT_EQ(info->tensors[1].global_name, "w");
  EXPECT_TRUE(info->tensors[2].global_shape.empty());

  // A restarted daemon knows it from the shard alone.
  client.reset();
  daemon_->Kill(SIGTERM);
  daemon_->Wait();
  UnlinkArenas(prefix_);
  Restart();
  client = Connect("pieces");
  ASSERT_NE(client, nullptr);
  PieceState again(-1000);
  st = client->Restore(1, again.tensors, &layouts);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(again.w1, saved.w1);
  ExpectSavedLayouts(layouts, saved, "after a restart");

  // A tensor asked for at another place is refused, naming both places.
  PieceState moved(0);
  moved.tensors[1].layout->offsets = {6, 0};
  st = client->Restore(1, moved.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("tensors[1] (\"w.1\"): asked for offsets [6, 0] "
                              "of [8, 4] of \"w\", the checkpoint holds "
                              "offsets [4, 0] of [8, 4] of \"w\""),
            std::string::npos)
      << st;
  // Asked without a layout, a piece restores as it always did.
  PieceState plain(0);
  for (Tensor& t : plain.tensors) t.layout.reset();
  EXPECT_TRUE(client->Restore(1, plain.tensors).ok());
  EXPECT_EQ(plain.w0, saved.w0);
}

TEST_F(LayoutSaveTest, ABadLayoutIsRefusedNamingTheFieldAndChangesNothing) {
  auto client = Connect("badlayout");
  ASSERT_NE(client, nullptr);
  PieceState good(1);
  ASSERT_TRUE(client->Save(1, good.tensors).ok());

  struct Case {
    void (*mutate)(Tensor&);
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](Tensor& t) {
         t.layout->offsets = {7, 0};
       },
       "tensors[1].piece_offsets[0]: offset 7 + length 2 exceed "
       "global_shape[0] 8"},
      {[](Tensor& t) { t.layout->global_shape = {8}; },
       "tensors[1].global_shape: 1 dims, shape has 2"},
      {[](Tensor& t) { t.layout->offsets = {4}; },
       "tensors[1].piece_offsets: 1 dims, shape has 2"},
      {[](Tensor& t) { t.layout->global_name = "w\n"; },
       "tensors[1].global_name"},
      {[](Tensor& t) {
         t.layout->global_shape.clear();
         t.layout->offsets.clear();
       },
       "tensors[1].global_name: set without global_shape"},
  };
  for (const Case& c : cases) {
    PieceState bad(2);
    c.mutate(bad.tensors[1]);
    absl::Status st = client->Save(2, bad.tensors);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(c.message), std::string::npos)
        << st << "\nexpected: " << c.message;
  }
  // Nothing changed: step 1 is the newest, step 2 does not exist, and the
  // slot is free for a good save of step 2.
  absl::StatusOr<int64_t> latest = client->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, 1);
  PieceState none(0);
  EXPECT_EQ(client->Restore(2, none.tensors).code(),
            absl::StatusCode::kNotFound);
  PieceState second(2);
  ASSERT_TRUE(client->Save(2, second.tensors).ok());
  PieceState got(0);
  ASSERT_TRUE(client->Restore(2, got.tensors).ok());
  EXPECT_EQ(got.w1, second.w1);
  // A negative value cannot travel at all: the client refuses it.
  PieceState negative(3);
  negative.tensors[0].layout->offsets = {-1, 0};
  absl::Status st = client->Save(3, negative.tensors);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("tensors[0] (\"w.0\").layout.offsets[0]: -1 is "
                              "negative"),
            std::string::npos)
      << st;
}

// The node's manifest carries the step's layout index: every piece of
// every rank, built by ckptd from the commits, readable without the ranks.
TEST_F(LayoutSaveTest, TheManifestCarriesTheLayoutIndexOfEveryRank) {
  auto r0 = Connect("indexed", 0, 2), r1 = Connect("indexed", 1, 2);
  ASSERT_NE(r0, nullptr);
  ASSERT_NE(r1, nullptr);
  // "w" [8, 4]: rows [0, 4) on rank 0, [4, 8) on rank 1; "b" a replica.
  std::vector<float> w0(16, 1.0f), w1(16, 2.0f), b(3, 3.0f);
  std::vector<Tensor> t0 = {
      {"w",
       DType::kFloat32,
       {4, 4},
       w0.data(),
       Device::Host(),
       TensorLayout{{8, 4}, {0, 0}, ""}},
      {"b", DType::kFloat32, {3}, b.data(), Device::Host(), std::nullopt}};
  std::vector<Tensor> t1 = t0;
  t1[0].data = w1.data();
  t1[0].layout->offsets = {4, 0};
  ASSERT_TRUE(r0->Save(2, t0).ok());
  ASSERT_TRUE(r1->Save(2, t1).ok());
  // Durable shards: the step's directory exists, the manifest follows.
  ASSERT_TRUE(r0->WaitDurable(2).ok());
  ASSERT_TRUE(r1->WaitDurable(2).ok());
  const std::string key = storage::ManifestKey("indexed", 2);
  ASSERT_TRUE(AwaitFile(root() + "/" + key));
  std::ifstream f(root() + "/" + key);
  const std::string text((std::istreambuf_iterator<char>(f)),
                         std::istreambuf_iterator<char>());
  absl::StatusOr<storage::v1::NodeManifest> m =
      storage::DecodeNodeManifest(text, key);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<storage::LayoutIndex> index =
      storage::ParseLayoutIndex(m->layout_index());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->world_size(), 2u);
  EXPECT_EQ(index->num_pieces(), 4u);
  const int64_t w = index->FindTensor("w"), bi = index->FindTensor("b");
  ASSERT_GE(w, 0);
  ASSERT_GE(bi, 0);
  const storage::LayoutTensor& tw = index->tensors()[w];
  EXPECT_EQ(tw.global_shape[0], 8u);
  EXPECT_EQ(tw.global_shape[1], 4u);
  ASSERT_EQ(tw.num_pieces, 2u);
  for (uint64_t p = tw.first_piece; p < tw.first_piece + 2; ++p) {
    const uint32_t rank = index->piece_rank(p);
    storage::Box box = index->PieceBox(p);
    EXPECT_EQ(box.ToString(), rank == 0 ? "offsets [0, 0] lengths [4, 4]"
                                        : "offsets [4, 0] lengths [4, 4]");
  }
  EXPECT_EQ(index->tensors()[bi].num_pieces, 2u);  // one replica per rank

  // A step without any layout has a manifest without an index.
  std::vector<Tensor> plain0 = t0, plain1 = t1;
  plain0[0].layout.reset();
  plain1[0].layout.reset();
  ASSERT_TRUE(r0->Save(3, plain0).ok());
  ASSERT_TRUE(r1->Save(3, plain1).ok());
  ASSERT_TRUE(r0->WaitDurable(3).ok());
  ASSERT_TRUE(r1->WaitDurable(3).ok());
  const std::string key3 = storage::ManifestKey("indexed", 3);
  ASSERT_TRUE(AwaitFile(root() + "/" + key3));
  std::ifstream f3(root() + "/" + key3);
  const std::string text3((std::istreambuf_iterator<char>(f3)),
                          std::istreambuf_iterator<char>());
  EXPECT_EQ(text3.find("layout_index"), std::string::npos) << text3;
}

TEST_F(LayoutSaveTest, CApiSavesLayoutsAndRestoreReportsThem) {
  ckpt_options o;
  ckpt_options_init(&o);
  const std::string socket = daemon_->socket();
  o.socket_path = socket.c_str();
  o.job = "capi-layout";
  o.rank = 0;
  o.world_size = 1;
  ckpt_client* c = nullptr;
  ASSERT_EQ(ckpt_connect(&o, &c), CKPT_OK) << ckpt_last_error();

  std::vector<float> piece(6), whole(2), back(6, -1), whole_back(2, -1);
  std::iota(piece.begin(), piece.end(), 10.0f);
  std::iota(whole.begin(), whole.end(), 20.0f);
  const int64_t shape[] = {3, 2}, global[] = {9, 2}, offsets[] = {3, 0},
                shape1[] = {2};
  const ckpt_tensor ts[] = {
      {"emb.1", CKPT_FLOAT32, 2, shape, piece.data(), -1},
      {"bias", CKPT_FLOAT32, 1, shape1, whole.data(), -1}};
  const ckpt_tensor_layout ls[] = {{global, offsets, "emb"},
                                   {nullptr, nullptr, nullptr}};
  ASSERT_EQ(ckpt_save_layout(c, 4, ts, ls, 2, nullptr), CKPT_OK)
      << ckpt_last_error();

  const ckpt_tensor into[] = {
      {"emb.1", CKPT_FLOAT32, 2, shape, back.data(), -1},
      {"bias", CKPT_FLOAT32, 1, shape1, whole_back.data(), -1}};
  ckpt_saved_layout saved[2];
  std::memset(saved, 0x7f, sizeof(saved));
  ASSERT_EQ(ckpt_restore_layout(c, 4, into, nullptr, 2, saved), CKPT_OK)
      << ckpt_last_error();
  EXPECT_EQ(back, piece);
  EXPECT_EQ(whole_back, whole);
  EXPECT_EQ(saved[0].has_layout, 1);
  EXPECT_EQ(saved[0].ndim, 2);
  EXPECT_EQ(saved[0].global_shape[0], 9);
  EXPECT_EQ(saved[0].global_shape[1], 2);
  EXPECT_EQ(saved[0].offsets[0], 3);
  EXPECT_EQ(saved[0].offsets[1], 0);
  EXPECT_EQ(saved[0].global_shape[2], 0);
  EXPECT_STREQ(saved[0].global_name, "emb");
  EXPECT_EQ(saved[1].has_layout, 0);
  EXPECT_EQ(saved[1].ndim, 0);
  EXPECT_STREQ(saved[1].global_name, "");

  // Asked at another place: refused, naming both places.
  const int64_t elsewhere[] = {6, 0};
  const ckpt_tensor_layout moved[] = {{global, elsewhere, "emb"},
                                      {nullptr, nullptr, nullptr}};
  EXPECT_EQ(ckpt_restore_layout(c, 4, into, moved, 2, nullptr),
            CKPT_FAILED_PRECONDITION);
  EXPECT_NE(std::string(ckpt_last_error()).find("asked for offsets [6, 0]"),
            std::string::npos)
      << ckpt_last_error();

  // A piece outside its global tensor: the daemon's refusal names the field;
  // step 5 does not exist afterwards.
  const int64_t outside[] = {8, 0};
  const ckpt_tensor_layout bad[] = {{global, outside, "emb"},
                                    {nullptr, nullptr, nullptr}};
  EXPECT_EQ(ckpt_save_layout(c, 5, ts, bad, 2, nullptr), CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error())
                .find("tensors[0].piece_offsets[0]: offset 8 + length 3 "
                      "exceed global_shape[0] 9"),
            std::string::npos)
      << ckpt_last_error();
  int64_t latest = -1;
  EXPECT_EQ(ckpt_latest_step(c, &latest), CKPT_OK);
  EXPECT_EQ(latest, 4);
  // offsets NULL beside a global_shape: refused before any RPC.
  const ckpt_tensor_layout no_offsets[] = {{global, nullptr, nullptr},
                                           {nullptr, nullptr, nullptr}};
  EXPECT_EQ(ckpt_save_layout(c, 5, ts, no_offsets, 2, nullptr),
            CKPT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckpt_last_error())
                .find("layouts[0] (\"emb.1\").offsets: NULL"),
            std::string::npos)
      << ckpt_last_error();

  // The asynchronous save carries them too.
  ckpt_save_handle* h = nullptr;
  ASSERT_EQ(ckpt_save_async_layout(c, 6, ts, ls, 2, nullptr, &h), CKPT_OK)
      << ckpt_last_error();
  ASSERT_EQ(ckpt_wait(h), CKPT_OK) << ckpt_last_error();
  std::memset(saved, 0, sizeof(saved));
  ASSERT_EQ(ckpt_restore_layout(c, 6, into, ls, 2, saved), CKPT_OK)
      << ckpt_last_error();
  EXPECT_EQ(saved[0].offsets[0], 3);
  ckpt_close(c);
}

}  // namespace
}  // namespace ckpt::testing
