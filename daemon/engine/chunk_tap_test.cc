// ChunkTap (chunk_tap.h): the hashes of a load's checksum chunks taken as
// the bytes come in equal the slot's, whatever order, restarts and breaks
// the pieces' transfers show them in; a chunk not shown whole is read from
// the slot.
#include "daemon/engine/chunk_tap.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "util/checksum.h"

namespace ckpt::daemon {
namespace {

constexpr uint64_t kMiB = 1 << 20;

class ChunkTapTest : public ::testing::Test {
 protected:
  // An image of 7 MiB + 4 KiB: a 4 KiB header, then tensors of 2.5 MiB,
  // 0 bytes, 1 MiB + 7 and 3 MiB (offsets not 1 MiB-aligned), read in
  // pieces of 3 MiB, so pieces cut some chunks.
  void SetUp() override {
    std::mt19937_64 rng(7);
    image_.resize(7 * kMiB + 4096);
    for (char& c : image_) c = static_cast<char>(rng());
    uint64_t at = 4096;
    for (uint64_t bytes : {5 * kMiB / 2, uint64_t{0}, kMiB + 7, 3 * kMiB}) {
      storage::ShardTensor t;
      t.name = "t" + std::to_string(info_.tensors.size());
      t.offset = at;
      t.bytes = bytes;
      t.checksum = TensorChecksum(image_.data() + at, bytes);
      info_.tensors.push_back(t);
      at += bytes;
    }
  }
  // Shows [from, to) of the piece starting at `piece` in steps of `step`
  // bytes, the bytes taken from `src`.
  static void Show(ChunkTap& tap, const std::vector<char>& src, uint64_t piece,
                   uint64_t from, uint64_t to, uint64_t step) {
    for (uint64_t at = from; at < to; at += step)
      tap.Seen(piece, at, src.data() + at, std::min(step, to - at));
  }
  // Every piece shown whole and in order.
  void ShowAll(ChunkTap& tap, uint64_t step) {
    for (uint64_t piece = 0; piece < image_.size(); piece += kPiece)
      Show(tap, image_, piece, piece,
           std::min<uint64_t>(piece + kPiece, image_.size()), step);
  }
  static constexpr uint64_t kPiece = 3 * kMiB;
  std::vector<char> image_;
  storage::ShardInfo info_;
};

// Whole pieces in order: every chunk no piece's end cuts is hashed as it
// comes, whatever the receive's sizes; the checksums are the image's.
TEST_F(ChunkTapTest, ChunksShownWholeAreHashedAsTheyCome) {
  for (uint64_t step : {uint64_t{1000}, uint64_t{16411}, kMiB + 3}) {
    ChunkTap tap(info_);
    ShowAll(tap, step);
    // Chunks: 3 + 0 + 2 + 3 = 8; the piece ends at 3 and 6 MiB cut one
    // each (tensor 2's first, tensor 3's last).
    EXPECT_EQ(tap.SeenWhole(), (std::pair<size_t, size_t>{6, 8})) << step;
    for (size_t i = 0; i < info_.tensors.size(); ++i)
      EXPECT_EQ(tap.Checksum(i, image_.data()), info_.tensors[i].checksum)
          << "tensor " << i << ", receives of " << step;
    // Tensor 0 (within the first piece) never reads the slot: its
    // checksum holds with a slot of zeros; tensor 2's cut chunk is read.
    std::vector<char> zeros(image_.size());
    EXPECT_EQ(tap.Checksum(0, zeros.data()), info_.tensors[0].checksum);
    EXPECT_NE(tap.Checksum(2, zeros.data()), info_.tensors[2].checksum)
        << "tensor 2's cut chunk is read from the slot";
  }
}

// A piece whose first transfer showed other bytes and broke off starts
// over: only the retry's bytes count; what the first one hashed is void
// even where the retry breaks off before it (then the slot is read).
TEST_F(ChunkTapTest, ARestartedPieceCountsOnlyItsLastTransfer) {
  std::vector<char> bad = image_;
  for (char& c : bad) c ^= 0x5a;
  {
    ChunkTap tap(info_);
    Show(tap, bad, kPiece, kPiece, kPiece + 2 * kMiB + 5, 65536);
    ShowAll(tap, 65536);  // the retry, whole
    EXPECT_EQ(tap.SeenWhole().first, 6u);
    for (size_t i = 0; i < info_.tensors.size(); ++i)
      EXPECT_EQ(tap.Checksum(i, image_.data()), info_.tensors[i].checksum) << i;
  }
  ChunkTap tap(info_);
  Show(tap, bad, kPiece, kPiece, kPiece + 2 * kMiB + 5, 65536);
  Show(tap, image_, kPiece, kPiece, kPiece + 65536, 65536);  // the retry
  Show(tap, image_, kPiece, kPiece + 2 * 65536, 2 * kPiece, 65536);  // a gap
  for (size_t i = 0; i < info_.tensors.size(); ++i)
    EXPECT_EQ(tap.Checksum(i, image_.data()), info_.tensors[i].checksum) << i;
}

// Bytes that do not follow the ones before (a gap) make the piece's
// hashes void: its chunks are read from the slot, which holds what was
// stored, and a damaged byte there is found.
TEST_F(ChunkTapTest, APieceThatSkipsBytesIsReadFromTheSlot) {
  ChunkTap tap(info_);
  Show(tap, image_, 0, 0, kPiece, 65536);
  Show(tap, image_, kPiece, kPiece, kPiece + kMiB, 65536);
  Show(tap, image_, kPiece, kPiece + kMiB + 4096, 2 * kPiece, 65536);  // gap
  Show(tap, image_, 2 * kPiece, 2 * kPiece, image_.size(), 65536);
  // Tensor 3's second chunk lies in piece 1: it is read from the slot.
  std::vector<char> slot = image_;
  slot[info_.tensors[3].offset + kMiB + 100] ^= 1;
  EXPECT_NE(tap.Checksum(3, slot.data()), info_.tensors[3].checksum);
  EXPECT_EQ(tap.Checksum(3, image_.data()), info_.tensors[3].checksum);
  EXPECT_EQ(tap.Checksum(2, image_.data()), info_.tensors[2].checksum);
  // Only piece 0's chunks (tensor 0's three) were hashed as they came: the
  // one piece 1 completed before the gap is void, piece 2 has none whole.
  EXPECT_EQ(tap.SeenWhole().first, 3u);
}

// Damaged bytes on the wire give a checksum that does not match, even when
// the slot were to hold good ones: the check is of what came in.
TEST_F(ChunkTapTest, ADamagedByteOnTheWireFailsItsTensor) {
  std::vector<char> wire = image_;
  wire[info_.tensors[3].offset + kMiB + 17] ^= 0x10;  // piece 1, whole
  ChunkTap tap(info_);
  for (uint64_t piece = 0; piece < wire.size(); piece += kPiece)
    Show(tap, wire, piece, piece,
         std::min<uint64_t>(piece + kPiece, wire.size()), 65536);
  EXPECT_NE(tap.Checksum(3, image_.data()), info_.tensors[3].checksum);
  EXPECT_EQ(tap.Checksum(2, image_.data()), info_.tensors[2].checksum);
}

}  // namespace
}  // namespace ckpt::daemon
