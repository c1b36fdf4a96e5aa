#include "storage/shard_format.h"

#include <cstddef>
#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "storage/shard_testing.h"
#include "util/checksum.h"

namespace ckpt::storage {
namespace {

absl::StatusOr<ShardInfo> Decode(const std::vector<char>& image) {
  absl::StatusOr<ShardHeader> h = DecodeHeader(image);
  if (!h.ok()) return h.status();
  if (h->footer_offset + kShardAlign > image.size())
    return DecodeShardMetadata(image, {}, image.size());
  return DecodeShardMetadata(
      image, std::span<const char>(image).subspan(h->footer_offset),
      image.size());
}

ShardHeader* Header(std::vector<char>& image) {
  return reinterpret_cast<ShardHeader*>(image.data());
}
IndexEntry* Entry(std::vector<char>& image, size_t i) {
  return reinterpret_cast<IndexEntry*>(image.data() + kShardAlign +
                                       i * sizeof(IndexEntry));
}
ShardFooter* Footer(std::vector<char>& image) {
  return reinterpret_cast<ShardFooter*>(image.data() +
                                        Header(image)->footer_offset);
}
// Recomputes every checksum so that a test reaches the check behind them.
void Reseal(std::vector<char>& image) {
  ShardHeader* h = Header(image);
  const uint64_t per =
      sizeof(IndexEntry) +
      (h->version == kShardVersionLayout ? sizeof(LayoutEntry) : 0);
  const uint64_t index_bytes = uint64_t{h->num_tensors} * per;
  if (kShardAlign + index_bytes <= image.size())
    h->index_checksum = Hash64(image.data() + kShardAlign, index_bytes);
  h->header_checksum = Hash64(h, offsetof(ShardHeader, header_checksum));
  ShardFooter* f = Footer(image);
  f->index_checksum = h->index_checksum;
  f->footer_checksum = Hash64(f, offsetof(ShardFooter, footer_checksum));
}

void ExpectDataLoss(const absl::StatusOr<ShardInfo>& r,
                    const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos)
      << r.status();
}

TEST(ComputeLayout, PlacesEveryTensorAtAnAlignedOffsetInOrder) {
  std::vector<uint64_t> sizes = {10, 0, 4096, 5000, 0};
  ShardLayout l = *ComputeLayout(sizes);
  EXPECT_EQ(l.index_offset, 4096u);
  EXPECT_EQ(l.data_offset, 8192u);  // 4096 + 5 * 256, aligned up
  EXPECT_EQ(l.tensor_offsets,
            (std::vector<uint64_t>{8192, 12288, 12288, 16384, 24576}));
  EXPECT_EQ(l.footer_offset, 24576u);
  EXPECT_EQ(l.image_bytes, 24576u + 4096);
}

TEST(ComputeLayout, EmptyShardIsHeaderIndexAndFooter) {
  ShardLayout l = *ComputeLayout({});
  EXPECT_EQ(l.data_offset, 4096u);
  EXPECT_EQ(l.footer_offset, 4096u);
  EXPECT_EQ(l.image_bytes, 8192u);
}

TEST(ComputeLayout, IndexSpillsIntoSeveralBlocks) {
  std::vector<uint64_t> sizes(17, 1);
  EXPECT_EQ(ComputeLayout(sizes)->data_offset,
            4096u + 8192u);  // 17*256 = 4352 bytes of index
}

TEST(ComputeLayout, RejectsTooManyTensorsAndOverflow) {
  std::vector<uint64_t> many(kMaxShardTensors + 1, 1);
  EXPECT_EQ(ComputeLayout(many).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> huge = {UINT64_MAX - 100};
  EXPECT_EQ(ComputeLayout(huge).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ShardFormat, EncodeDecodeRoundTrips) {
  Shard s = MakeShard({{3, 5}, {}, {0}, {1000, 3}, {2, 2, 2, 2, 2, 2, 2, 2}});
  absl::StatusOr<ShardInfo> d = Decode(s.image);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->job, "job-a");
  EXPECT_EQ(d->step, 42u);
  EXPECT_EQ(d->rank, 1u);
  EXPECT_EQ(d->world_size, 4u);
  EXPECT_EQ(d->created_unix_ns, 123456789u);
  ASSERT_EQ(d->tensors.size(), s.info.tensors.size());
  for (size_t i = 0; i < d->tensors.size(); ++i) {
    EXPECT_EQ(d->tensors[i].name, s.info.tensors[i].name);
    EXPECT_EQ(d->tensors[i].shape, s.info.tensors[i].shape);
    EXPECT_EQ(d->tensors[i].offset, s.info.tensors[i].offset);
    EXPECT_EQ(d->tensors[i].bytes, s.info.tensors[i].bytes);
    EXPECT_EQ(d->tensors[i].checksum, s.info.tensors[i].checksum);
  }
  EXPECT_EQ(d->layout.image_bytes, s.image.size());
}

TEST(ValidateShardInfo, NamesTheTensorAndFieldOfAWrongOffset) {
  Shard s = MakeShard({{4}, {4}});
  s.info.tensors[1].offset += 4096;
  absl::Status st = ValidateShardInfo(&s.info);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "tensors[1] (\"layer1.weight\").offset: 16384, expected 12288");
}

TEST(ValidateShardInfo, RejectsDuplicateBadDtypeWrongBytesAndTooManyDims) {
  struct Case {
    void (*mutate)(ShardInfo&);
    std::string field;
  };
  std::vector<Case> cases = {
      {[](ShardInfo& i) { i.tensors[1].name = i.tensors[0].name; },
       "tensors[1] (\"layer0.weight\").name"},
      {[](ShardInfo& i) { i.tensors[0].name = "bad\nname"; },
       "tensors[0] (\"bad\\nname\").name"},
      {[](ShardInfo& i) { i.tensors[0].dtype = static_cast<DType>(99); },
       ".dtype: 99"},
      {[](ShardInfo& i) { i.tensors[0].bytes += 1; },
       "tensors[0] (\"layer0.weight\").bytes"},
      {[](ShardInfo& i) { i.tensors[0].shape.assign(9, 1); },
       "tensors[0] (\"layer0.weight\").shape"},
      {[](ShardInfo& i) { i.job = "../etc"; }, "job"},
      {[](ShardInfo& i) { i.rank = 4; }, "rank"},
  };
  for (const Case& c : cases) {
    Shard s = MakeShard({{4}, {4}});
    c.mutate(s.info);
    absl::Status st = ValidateShardInfo(&s.info);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(std::string(st.message()).find(c.field), std::string::npos) << st;
  }
}

TEST(ShardFormat, EncodeRefusesAnImageTooSmall) {
  Shard s = MakeShard({{4}});
  std::vector<char> small(s.image.size() - 1);
  EXPECT_EQ(EncodeShardMetadata(s.info, small).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DecodeShardMetadata, DetectsFlippedBitsInHeaderIndexAndFooter) {
  Shard s = MakeShard({{7}, {300, 2}});
  const uint64_t footer = Header(s.image)->footer_offset;
  struct Flip {
    uint64_t byte;
    std::string field;
  };
  std::vector<Flip> flips = {
      {0, "header.magic"},
      {offsetof(ShardHeader, version), "header.version"},
      {offsetof(ShardHeader, step), "header.header_checksum"},
      {offsetof(ShardHeader, job) + 2, "header.header_checksum"},
      {kShardAlign + 3, "header.index_checksum"},
      {kShardAlign + 256 + offsetof(IndexEntry, offset),
       "header.index_checksum"},
      {footer + 1, "footer.magic"},
      {footer + offsetof(ShardFooter, step), "footer.footer_checksum"},
      {footer + offsetof(ShardFooter, footer_checksum),
       "footer.footer_checksum"},
  };
  for (const Flip& f : flips) {
    std::vector<char> image = s.image;
    image[f.byte] ^= 0x10;
    ExpectDataLoss(Decode(image), f.field);
  }
}

TEST(DecodeShardMetadata, ChecksHeaderFieldsBehindAValidChecksum) {
  Shard s = MakeShard({{7}, {300, 2}});
  struct Case {
    void (*mutate)(std::vector<char>&);
    std::string field;
  };
  std::vector<Case> cases = {
      {[](std::vector<char>& im) { Header(im)->header_bytes = 100; },
       "header.header_bytes"},
      {[](std::vector<char>& im) { Header(im)->index_entry_bytes = 128; },
       "header.index_entry_bytes"},
      {[](std::vector<char>& im) {
         Header(im)->num_tensors = kMaxShardTensors + 1;
       },
       "header.num_tensors"},
      {[](std::vector<char>& im) { Header(im)->index_offset = 0; },
       "header.index_offset"},
      {[](std::vector<char>& im) { Header(im)->data_offset += 4096; },
       "header.data_offset"},
      {[](std::vector<char>& im) { Header(im)->checksum_chunk_bytes = 4096; },
       "header.checksum_chunk_bytes"},
      {[](std::vector<char>& im) { std::memset(Header(im)->job, 'x', 128); },
       "header.job: not NUL-terminated"},
      {[](std::vector<char>& im) { Header(im)->job[0] = '.'; }, "header.job"},
      {[](std::vector<char>& im) { Header(im)->rank = 9; }, "footer.rank"},
      {[](std::vector<char>& im) { Footer(im)->step = 1; }, "footer.step"},
      {[](std::vector<char>& im) { Entry(im, 1)->offset += 4096; },
       "tensors[1] (\"layer1.weight\").offset"},
      {[](std::vector<char>& im) { Entry(im, 0)->bytes = 24; },
       "tensors[0] (\"layer0.weight\").bytes"},
      {[](std::vector<char>& im) { Entry(im, 0)->ndim = 9; },
       "tensors[0] (\"layer0.weight\").ndim"},
      {[](std::vector<char>& im) { Entry(im, 0)->shape[5] = 1; },
       "tensors[0] (\"layer0.weight\").shape[5]"},
      {[](std::vector<char>& im) { Entry(im, 0)->dtype = 0; },
       "tensors[0] (\"layer0.weight\").dtype"},
      {[](std::vector<char>& im) { std::memset(Entry(im, 1)->name, 'a', 160); },
       "tensors[1].name: not NUL"},
      {[](std::vector<char>& im) { Entry(im, 1)->name[150] = 'z'; },
       "tensors[1].name: garbage"},
      {[](std::vector<char>& im) {
         std::memcpy(Entry(im, 1)->name, "layer0.weight", 13);
       },
       "tensors[1] (\"layer0.weight\").name: duplicate"},
  };
  for (const Case& c : cases) {
    std::vector<char> image = s.image;
    c.mutate(image);
    Reseal(image);
    ExpectDataLoss(Decode(image), c.field);
  }
}

// Tensor 0 ("layer0.weight", [3, 4]) is rows 2..4 of a global "w" [8, 4];
// tensor 1 stays whole.
void PlaceFirst(ShardInfo& info) {
  info.tensors[0].global_shape = {8, 4};
  info.tensors[0].piece_offsets = {2, 0};
  info.tensors[0].global_name = "w";
}
LayoutEntry* Layout(std::vector<char>& image, size_t i) {
  const ShardHeader* h = Header(image);
  return reinterpret_cast<LayoutEntry*>(image.data() + kShardAlign +
                                        h->num_tensors * sizeof(IndexEntry) +
                                        i * sizeof(LayoutEntry));
}

TEST(ShardLayoutFields, AShardWithoutThemIsVersion1ByteForByte) {
  // What every shard written before layouts looks like: version 1, the
  // data right after 256-byte entries; it reads with no layout.
  Shard s = MakeShard({{7}, {300, 2}});
  EXPECT_EQ(Header(s.image)->version, 1u);
  EXPECT_EQ(Header(s.image)->data_offset, 2 * kShardAlign);
  absl::StatusOr<ShardInfo> got = Decode(s.image);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layout.version, 1u);
  for (const ShardTensor& t : got->tensors) {
    EXPECT_TRUE(t.global_shape.empty());
    EXPECT_TRUE(t.piece_offsets.empty());
    EXPECT_TRUE(t.global_name.empty());
  }
}

TEST(ShardLayoutFields, RoundTripInAVersion2Shard) {
  Shard s = MakeShard({{3, 4}, {300, 2}}, 1, PlaceFirst);
  EXPECT_EQ(Header(s.image)->version, kShardVersionLayout);
  absl::StatusOr<ShardInfo> got = Decode(s.image);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->layout.version, kShardVersionLayout);
  EXPECT_EQ(got->tensors[0].global_shape, (std::vector<uint64_t>{8, 4}));
  EXPECT_EQ(got->tensors[0].piece_offsets, (std::vector<uint64_t>{2, 0}));
  EXPECT_EQ(got->tensors[0].global_name, "w");
  EXPECT_TRUE(got->tensors[1].global_shape.empty());
  EXPECT_EQ(got->tensors[0].offset, s.info.tensors[0].offset);
  // 2 x (256 + 296) bytes of index still fit the first index block.
  EXPECT_EQ(got->layout.data_offset, 2 * kShardAlign);
  // Many tensors: the layout table moves the data further than in v1.
  std::vector<uint64_t> sizes(20, 4);
  EXPECT_EQ(ComputeLayout(sizes, true)->data_offset, 4 * kShardAlign);
  EXPECT_EQ(ComputeLayout(sizes, false)->data_offset, 3 * kShardAlign);
}

TEST(ShardLayoutFields, EveryFlippedByteOfTheLayoutTableIsCaught) {
  Shard s = MakeShard({{3, 4}, {300, 2}}, 1, PlaceFirst);
  for (size_t i = 0; i < 2 * sizeof(LayoutEntry); ++i) {
    std::vector<char> image = s.image;
    reinterpret_cast<char*>(Layout(image, 0))[i] ^= 0x01;
    ExpectDataLoss(Decode(image), "header.index_checksum");
  }
}

TEST(ShardLayoutFields, ChecksLayoutFieldsBehindAValidChecksum) {
  Shard s = MakeShard({{3, 4}, {300, 2}}, 1, PlaceFirst);
  struct Case {
    void (*mutate)(std::vector<char>&);
    std::string field;
  };
  std::vector<Case> cases = {
      {[](std::vector<char>& im) { Layout(im, 0)->piece_offsets[0] = 6; },
       "tensors[0] (\"layer0.weight\").piece_offsets[0]: offset 6 + length 3 "
       "exceed global_shape[0] 8"},
      {[](std::vector<char>& im) { Layout(im, 0)->global_shape[1] = 3; },
       "tensors[0] (\"layer0.weight\").piece_offsets[1]"},
      {[](std::vector<char>& im) { Layout(im, 0)->global_shape[2] = 1; },
       "tensors[0] (\"layer0.weight\").layout[2]: nonzero in an unused"},
      {[](std::vector<char>& im) { Layout(im, 0)->has_layout = 2; },
       "tensors[0] (\"layer0.weight\").layout.has_layout: 2"},
      {[](std::vector<char>& im) { Layout(im, 0)->reserved = 1; },
       "tensors[0] (\"layer0.weight\").layout.reserved"},
      {[](std::vector<char>& im) { Layout(im, 0)->global_name[0] = '\n'; },
       "tensors[0] (\"layer0.weight\").global_name"},
      {[](std::vector<char>& im) {
         std::memset(Layout(im, 0)->global_name, 'a', 160);
       },
       "layout.global_name: not NUL"},
      {[](std::vector<char>& im) { Layout(im, 1)->global_name[0] = 'x'; },
       "tensors[1] (\"layer1.weight\").layout.global_name: set without"},
      {[](std::vector<char>& im) { Layout(im, 1)->piece_offsets[0] = 1; },
       "tensors[1] (\"layer1.weight\").layout[0]: nonzero"},
      // A version-2 shard with no layout left is not canonical.
      {[](std::vector<char>& im) {
         std::memset(Layout(im, 0), 0, sizeof(LayoutEntry));
       },
       "header.version: 2, expected 1"},
      {[](std::vector<char>& im) { Header(im)->version = 3; },
       "header.version: 3, this build reads versions 1 and 2"},
  };
  for (const Case& c : cases) {
    std::vector<char> image = s.image;
    c.mutate(image);
    Reseal(image);
    ExpectDataLoss(Decode(image), c.field);
  }
}

TEST(ShardLayoutFields, EncodeRefusesALayoutThatDoesNotFit) {
  Shard s = MakeShard({{3, 4}, {300, 2}}, 1, PlaceFirst);
  ShardInfo info = s.info;
  info.tensors[0].global_shape = {8};
  absl::Status st = EncodeShardMetadata(info, s.image);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("global_shape: 1 dims, shape has 2"),
            std::string::npos)
      << st;
  info = s.info;
  info.tensors[1].global_name = "w";
  st = EncodeShardMetadata(info, s.image);
  EXPECT_NE(st.message().find("global_name: set without global_shape"),
            std::string::npos)
      << st;
}

TEST(DecodeShardMetadata, TruncatedFileNamesBothSizes) {
  Shard s = MakeShard({{1024}});
  std::vector<char> head(s.image.begin(),
                         s.image.begin() + Header(s.image)->data_offset);
  const uint64_t footer = Header(s.image)->footer_offset;
  auto r =
      DecodeShardMetadata(head, std::span<const char>(s.image).subspan(footer),
                          s.image.size() - 4096);
  ExpectDataLoss(r, "truncated: 12288 bytes, header says 16384");
}

TEST(DecodeShardMetadata, TruncationAtAnyOffsetIsDataLoss) {
  Shard s = MakeShard({{3000}, {5}, {0}});
  for (size_t len = 0; len < s.image.size(); len += 97) {
    std::vector<char> cut(s.image.begin(), s.image.begin() + len);
    absl::StatusOr<ShardInfo> r = Decode(cut);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len;
  }
}

TEST(DecodeShardMetadata, RandomGarbageAndRandomFlipsNeverPass) {
  Shard s = MakeShard({{30}, {500}, {7, 3}});
  std::mt19937_64 rng(7);
  const uint64_t footer = Header(s.image)->footer_offset;
  for (int i = 0; i < 2000; ++i) {
    std::vector<char> image = s.image;
    uint64_t pos = rng() % image.size();
    image[pos] ^= static_cast<char>(1u << (rng() % 8));
    absl::StatusOr<ShardInfo> r = Decode(image);
    // Metadata decode covers every metadata byte that carries meaning; the
    // padding after the structs and the tensor bytes are not its concern.
    bool meaningful =
        pos < sizeof(ShardHeader) ||
        (pos >= kShardAlign && pos < kShardAlign + 3 * sizeof(IndexEntry)) ||
        (pos >= footer && pos < footer + sizeof(ShardFooter));
    if (meaningful) {
      EXPECT_FALSE(r.ok()) << "flip at " << pos;
    }
  }
  for (int i = 0; i < 2000; ++i) {
    std::vector<char> garbage(rng() % 20000);
    for (char& c : garbage) c = static_cast<char>(rng());
    if (garbage.size() >= 8 && rng() % 2)
      std::memcpy(garbage.data(), kShardMagic, 8);
    EXPECT_FALSE(Decode(garbage).ok());
  }
}

TEST(ShardKeys, AreZeroPadded) {
  EXPECT_EQ(StepPrefix("job", 42), "job/step-00000000000000000042/");
  EXPECT_EQ(ShardKey("job", 42, 7),
            "job/step-00000000000000000042/rank-00007.shard");
  EXPECT_EQ(ManifestKey("job", 42), "job/step-00000000000000000042/MANIFEST");
  EXPECT_EQ(StepPrefix("j", UINT64_MAX), "j/step-18446744073709551615/");
}

}  // namespace
}  // namespace ckpt::storage
