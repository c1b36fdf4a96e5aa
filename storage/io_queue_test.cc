// IoQueue through a real file on a real disk (O_DIRECT honoured), with a
// ring and without (pread).
#include "storage/io_queue.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

constexpr uint64_t kAlign = 4096;

class IoQueueTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam() && !pool_.Probe()) GTEST_SKIP() << "no io_uring";
  }
  void TearDown() override {
    if (direct_ >= 0) close(direct_);
    if (buffered_ >= 0) close(buffered_);
  }
  // A file of n random bytes, opened buffered and O_DIRECT.
  void MakeFile(uint64_t n) {
    bytes_.resize(n);
    std::mt19937_64 rng(n);
    for (char& c : bytes_) c = static_cast<char>(rng());
    path_ = dir_.path() + "/f";
    int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, bytes_.data(), n), static_cast<ssize_t>(n));
    close(fd);
    buffered_ = open(path_.c_str(), O_RDONLY);
    direct_ = open(path_.c_str(), O_RDONLY | O_DIRECT);
    ASSERT_GE(buffered_, 0);
    if (direct_ < 0) GTEST_SKIP() << "no O_DIRECT under /var/tmp";
  }
  IoQueue NewQueue(uint64_t io_bytes) {
    return IoQueue(GetParam() ? &pool_ : nullptr, IoOp::kRead, 4, io_bytes,
                   "file " + path_);
  }
  // An aligned buffer of n bytes filled with 0xEE.
  char* Buffer(uint64_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlign, n) != 0) abort();
    std::memset(p, 0xEE, n);
    buffers_.emplace_back(static_cast<char*>(p), &std::free);
    return static_cast<char*>(p);
  }

  RingPool pool_{4, 2};
  testing::TempDir dir_;
  std::string path_;
  std::string bytes_;
  int buffered_ = -1, direct_ = -1;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> buffers_;
};

TEST_P(IoQueueTest, ReapReportsEveryRequestOnceByTagWithItsQueuedLength) {
  MakeFile((5 << 20) + 123);
  IoQueue q(GetParam() ? &pool_ : nullptr, IoOp::kRead, 4, 1 << 20,
            "file " + path_);
  char* buf = Buffer(6 << 20);
  // Aligned, ragged at both ends, and running to the end of the file.
  struct Range {
    uint64_t off, len;
  };
  const Range ranges[] = {
      {0, 2 << 20}, {(2 << 20) + 100, 5000}, {3 << 20, (2 << 20) + 123}};
  for (uint64_t t = 0; t < 3; ++t)
    q.Queue(direct_, buffered_, buf + ranges[t].off, ranges[t].off,
            ranges[t].len, ranges[t].len, t);
  std::map<uint64_t, uint64_t> got;
  while (q.outstanding() > 0)
    ASSERT_TRUE(
        q.Reap([&](uint64_t tag, uint64_t len) { got[tag] += len; }).ok());
  for (uint64_t t = 0; t < 3; ++t) {
    EXPECT_EQ(got[t], ranges[t].len) << "tag " << t;
    EXPECT_EQ(std::memcmp(buf + ranges[t].off, bytes_.data() + ranges[t].off,
                          ranges[t].len),
              0)
        << "tag " << t;
  }
}

TEST_P(IoQueueTest, ReadWritesNothingPastItsRangeWithoutRoom) {
  MakeFile(4 * kAlign);
  IoQueue q = NewQueue(1 << 20);
  char* buf = Buffer(2 * kAlign);
  const uint64_t len = kAlign + 100;
  q.Queue(direct_, buffered_, buf, 0, len, /*room=*/len, 0);
  ASSERT_TRUE(q.Finish().ok());
  EXPECT_EQ(std::memcmp(buf, bytes_.data(), len), 0);
  for (uint64_t i = len; i < 2 * kAlign; ++i)
    ASSERT_EQ(static_cast<unsigned char>(buf[i]), 0xEE) << "byte " << i;
}

TEST_P(IoQueueTest, ReadMayFinishARaggedTailInTheCallersRoom) {
  MakeFile(kAlign + 100);  // the tail's block runs past the end of the file
  IoQueue q = NewQueue(1 << 20);
  char* buf = Buffer(2 * kAlign);
  q.Queue(direct_, buffered_, buf, 0, kAlign + 100, 2 * kAlign, 7);
  uint64_t reported = 0;
  while (q.outstanding() > 0)
    ASSERT_TRUE(q.Reap([&](uint64_t tag, uint64_t len) {
                   EXPECT_EQ(tag, 7u);
                   reported += len;
                 }).ok());
  EXPECT_EQ(reported, kAlign + 100);
  EXPECT_EQ(std::memcmp(buf, bytes_.data(), kAlign + 100), 0);
}

TEST_P(IoQueueTest, ReadPastTheEndIsDataLossNamingTheFile) {
  MakeFile(kAlign);
  IoQueue q = NewQueue(1 << 20);
  char* buf = Buffer(2 * kAlign);
  q.Queue(direct_, buffered_, buf, 0, 2 * kAlign, 2 * kAlign, 0);
  absl::Status s;
  while (s.ok() && q.outstanding() > 0) s = q.Reap([](uint64_t, uint64_t) {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
}

TEST_P(IoQueueTest, DestroyingTheQueueDropsWhatWasNeverSubmitted) {
  // A restore that gives up (a tensor failed its copy) must not go on
  // reading the rest of the file into the caller's memory.
  MakeFile(1 << 20);
  char* buf = Buffer(1 << 20);
  {
    IoQueue q = NewQueue(64 << 10);
    q.Queue(direct_, buffered_, buf, 0, 1 << 20, 1 << 20, 0);
    EXPECT_EQ(q.outstanding(), 16u);
  }
  for (uint64_t i = 0; i < (1 << 20); ++i)
    ASSERT_EQ(static_cast<unsigned char>(buf[i]), 0xEE) << "byte " << i;
}

INSTANTIATE_TEST_SUITE_P(IoPaths, IoQueueTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "io_uring" : "pread";
                         });

}  // namespace
}  // namespace ckpt::storage
