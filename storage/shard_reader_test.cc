#include "storage/shard_reader.h"

#include <cstring>
#include <random>

#include "gtest/gtest.h"
#include "storage/shard_testing.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

class ShardReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalBackendOptions o;
    o.root = dir_.path();
    auto b = NewLocalBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    backend_ = std::move(*b);
  }
  void Put(const std::string& key, const std::vector<char>& bytes) {
    ASSERT_TRUE(
        backend_
            ->PutSmallObject(key, std::string_view(bytes.data(), bytes.size()))
            .ok());
  }
  ckpt::testing::TempDir dir_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(ShardReaderTest, ReadsAndVerifiesAGoodShard) {
  // 3 MiB + a bit: several checksum chunks, spanning verify buffer fills.
  Shard s = MakeShard({{(3 << 18) + 5}, {0}, {17, 3}});
  Put("j/r0", s.image);
  absl::StatusOr<ShardInfo> info = ReadShardInfo(*backend_, "j/r0");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tensors.size(), 3u);
  int called = 0;
  absl::Status v = VerifyShard(*backend_, "j/r0",
                               [&](const ShardTensor& t, uint64_t computed) {
                                 EXPECT_EQ(t.checksum, computed) << t.name;
                                 ++called;
                               });
  EXPECT_TRUE(v.ok()) << v;
  EXPECT_EQ(called, 3);
}

TEST_F(ShardReaderTest, VerifyNamesTheCorruptedTensor) {
  Shard s = MakeShard({{100}, {2000}, {300}});
  s.image[s.info.tensors[1].offset + 1234] ^= 1;
  s.image[s.info.tensors[2].offset] ^= 1;
  Put("j/r0", s.image);
  ASSERT_TRUE(ReadShardInfo(*backend_, "j/r0").ok());  // metadata is intact
  absl::Status v = VerifyShard(*backend_, "j/r0");
  EXPECT_EQ(v.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(
      std::string(v.message())
          .find("j/r0: tensor \"layer1.weight\": checksum mismatch (stored 0x"),
      std::string::npos)
      << v;
  EXPECT_NE(std::string(v.message()).find("(and 1 more tensors)"),
            std::string::npos)
      << v;
}

TEST_F(ShardReaderTest, TruncationAtAnyOffsetIsDataLoss) {
  Shard s = MakeShard({{5000}, {7}});
  for (size_t len = 0; len < s.image.size(); len += 509) {
    Put("j/cut", std::vector<char>(s.image.begin(), s.image.begin() + len));
    absl::StatusOr<ShardInfo> r = ReadShardInfo(*backend_, "j/cut");
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
        << len << " " << r.status();
    EXPECT_NE(std::string(r.status().message()).find("truncated"),
              std::string::npos)
        << r.status();
  }
  std::vector<char> longer = s.image;
  longer.resize(longer.size() + 4096);
  Put("j/long", longer);
  EXPECT_EQ(ReadShardInfo(*backend_, "j/long").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(ShardReaderTest, GarbageIsDataLossNotACrash) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 50; ++i) {
    std::vector<char> junk(rng() % 50000);
    for (char& c : junk) c = static_cast<char>(rng());
    Put("j/junk", junk);
    EXPECT_FALSE(ReadShardInfo(*backend_, "j/junk").ok());
    EXPECT_FALSE(VerifyShard(*backend_, "j/junk").ok());
  }
  EXPECT_EQ(ReadShardInfo(*backend_, "j/none").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ShardReaderTest, ReadTensorFillsCallerMemoryAndChecksIt) {
  Shard s = MakeShard({{(1 << 18) + 3}, {0}, {5, 7}});
  Put("j/r0", s.image);
  auto reader = ShardReader::Open(*backend_, "j/r0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->info().tensors.size(), 3u);
  for (size_t i = 0; i < s.info.tensors.size(); ++i) {
    const ShardTensor& t = s.info.tensors[i];
    std::vector<char> dst(t.bytes + 1);
    ASSERT_TRUE((*reader)->ReadTensor(i, dst.data() + 1).ok())
        << i;  // unaligned dst
    EXPECT_EQ(std::memcmp(dst.data() + 1, s.image.data() + t.offset, t.bytes),
              0)
        << i;
  }
  EXPECT_EQ((*reader)->ReadTensor(3, nullptr).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(ShardReaderTest, ReadTensorNamesAFlippedTensor) {
  Shard s = MakeShard({{100}, {2000}});
  s.image[s.info.tensors[1].offset + 7] ^= 4;
  Put("j/r0", s.image);
  auto reader = ShardReader::Open(*backend_, "j/r0");
  ASSERT_TRUE(reader.ok());
  std::vector<char> dst(s.info.tensors[1].bytes);
  EXPECT_TRUE((*reader)->ReadTensor(0, dst.data()).ok());
  absl::Status st = (*reader)->ReadTensor(1, dst.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(st.message()).find("j/r0: tensor \"layer1.weight\""),
            std::string::npos)
      << st;
}

// One open: the reader keeps reading the object after its name is deleted.
TEST_F(ShardReaderTest, StreamTensorReadsThroughTheOneOpenObject) {
  Shard s = MakeShard({{(5 << 20) / 4 + 11}});
  Put("j/r0", s.image);
  auto reader = ShardReader::Open(*backend_, "j/r0");
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(backend_->Delete("j/r0").ok());
  std::string streamed;
  auto sum = (*reader)->StreamTensor(0, [&](const char* d, uint64_t n) {
    streamed.append(d, n);
    return absl::OkStatus();
  });
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, s.info.tensors[0].checksum);
  EXPECT_EQ(streamed, std::string(s.image.data() + s.info.tensors[0].offset,
                                  s.info.tensors[0].bytes));
  EXPECT_TRUE((*reader)->Verify().ok());
}

TEST(ChunkHasher, EqualsTensorChecksumHoweverThePiecesFall) {
  std::vector<char> v((3 << 20) + 77);
  std::mt19937 rng(3);
  for (char& c : v) c = static_cast<char>(rng());
  ChunkHasher whole, pieces;
  whole.Add(v.data(), v.size());
  pieces.Add(v.data(), 2 << 20);
  pieces.Add(v.data() + (2 << 20), v.size() - (2 << 20));
  EXPECT_EQ(whole.Finish(), TensorChecksum(v.data(), v.size()));
  EXPECT_EQ(pieces.Finish(), whole.Finish());
  EXPECT_EQ(ChunkHasher().Finish(), TensorChecksum(nullptr, 0));
}

}  // namespace
}  // namespace ckpt::storage
