#include "client/file_restore.h"

#include <gtest/gtest.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "util/checksum.h"

namespace ckpt::client {
namespace {

// A shard-like file: tensor a (1.5 MiB + 100 bytes) at 4096, tensor b (5000
// bytes) at the next 4 KiB boundary, in a file under /var/tmp (a disk, so
// O_DIRECT is taken where the file system allows it).
class FileRestorerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kA = (3 << 19) + 100;
  static constexpr uint64_t kB = 5000;
  static constexpr uint64_t kAOffset = 4096;
  static constexpr uint64_t kBOffset = (kAOffset + kA + 4095) / 4096 * 4096;
  static constexpr uint64_t kImage = kBOffset + 8192;

  void SetUp() override {
    char tmpl[] = "/var/tmp/file_restore_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/rank-0.shard";
    image_.resize(kImage);
    std::mt19937_64 rng(7);
    for (char& c : image_) c = static_cast<char>(rng());
    std::ofstream(path_, std::ios::binary).write(image_.data(), kImage);
    metas_.resize(2);
    SetMeta(&metas_[0], "a", kAOffset, kA);
    SetMeta(&metas_[1], "b", kBOffset, kB);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void SetMeta(v1::TensorMeta* m, const std::string& name, uint64_t offset,
               uint64_t bytes) {
    m->set_name(name);
    m->set_dtype(static_cast<uint32_t>(DType::kUInt8));
    m->add_shape(bytes);
    m->set_offset(offset);
    m->set_bytes(bytes);
    m->set_has_checksum(true);
    m->set_checksum(TensorChecksum(image_.data() + offset, bytes));
  }

  // Restores a and b into dst_a and dst_b.
  absl::Status Restore(const std::string& path, uint64_t image_bytes,
                       char* dst_a, char* dst_b) {
    std::vector<Tensor> t(2);
    t[0] = {
        "a", DType::kUInt8, {static_cast<int64_t>(kA)}, dst_a, Device::Host()};
    t[1] = {
        "b", DType::kUInt8, {static_cast<int64_t>(kB)}, dst_b, Device::Host()};
    std::vector<const v1::TensorMeta*> metas = {&metas_[0], &metas_[1]};
    return restorer_.Restore(path, image_bytes, t, metas);
  }

  std::string dir_, path_;
  std::vector<char> image_;
  std::vector<v1::TensorMeta> metas_;
  CopyEngine engine_{2};
  std::unique_ptr<DeviceCopier> devices_ = NewDeviceCopier();
  FileRestorer restorer_{&engine_, devices_.get()};
};

struct Aligned {
  explicit Aligned(uint64_t bytes) {
    p = static_cast<char*>(
        std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096 + 4096));
  }
  ~Aligned() { std::free(p); }
  char* p;
};

TEST_F(FileRestorerTest, ReadsAlignedAndUnalignedHostTensorsInOnePass) {
  Aligned a(kA), b(kB + 1);
  // a is 4 KiB-aligned (read straight in), b is not (bounce buffer).
  ASSERT_TRUE(Restore(path_, kImage, a.p, b.p + 1).ok());
  EXPECT_EQ(std::memcmp(a.p, image_.data() + kAOffset, kA), 0);
  EXPECT_EQ(std::memcmp(b.p + 1, image_.data() + kBOffset, kB), 0);
  // Again, with the bounce buffers kept from the first restore.
  std::memset(a.p, 0, kA);
  ASSERT_TRUE(Restore(path_, kImage, a.p + 1, b.p).ok());
  EXPECT_EQ(std::memcmp(a.p + 1, image_.data() + kAOffset, kA), 0);
  EXPECT_EQ(std::memcmp(b.p, image_.data() + kBOffset, kB), 0);
}

TEST_F(FileRestorerTest, AChecksumMismatchIsDataLossNamingTheTensor) {
  metas_[1].set_checksum(metas_[1].checksum() ^ 1);
  Aligned a(kA), b(kB);
  absl::Status s = Restore(path_, kImage, a.p, b.p);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("tensors[1] (\"b\")"), absl::string_view::npos)
      << s;
}

TEST_F(FileRestorerTest, AMissingFileIsAnErrorNamingThePathWithoutFallback) {
  Aligned a(kA), b(kB);
  absl::Status s = Restore(dir_ + "/gone.shard", kImage, a.p, b.p);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(dir_ + "/gone.shard"), absl::string_view::npos)
      << s;
}

TEST_F(FileRestorerTest, AFileOfAnotherSizeIsDataLossNamingThePath) {
  Aligned a(kA), b(kB);
  absl::Status s = Restore(path_, kImage + 4096, a.p, b.p);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
}

TEST_F(FileRestorerTest, ADirectoryIsAnErrorNamingThePath) {
  Aligned a(kA), b(kB);
  absl::Status s = Restore(dir_, kImage, a.p, b.p);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir_), absl::string_view::npos) << s;
}

// ReadSpans (a restore into another layout): spans out of order, one
// straight into aligned memory, one copied to unaligned memory, one only
// hashed; each hashed as the save hashed that chunk, and handed to the
// callback while its bytes are in memory.
TEST_F(FileRestorerTest, ReadSpansHashesEachSpanAndHandsItOver) {
  Aligned direct(kChecksumChunk), unaligned(kB + 1);
  // a's chunk 1 (0.5 MiB + 100 bytes), a's chunk 0 into aligned memory, b.
  std::vector<FileRestorer::Span> spans = {
      {kAOffset + kChecksumChunk, kA - kChecksumChunk, nullptr},
      {kAOffset, kChecksumChunk, direct.p},
      {kBOffset, kB, unaligned.p + 1}};
  std::vector<uint64_t> hashes(spans.size());
  std::vector<std::string> landed(spans.size());
  ASSERT_TRUE(restorer_
                  .ReadSpans(path_, kImage, spans, hashes,
                             [&](size_t i, const char* at, DeviceCopyBatch*) {
                               landed[i].assign(at, spans[i].bytes);
                               return absl::OkStatus();
                             })
                  .ok());
  for (size_t i = 0; i < spans.size(); ++i) {
    const char* want = image_.data() + spans[i].offset;
    EXPECT_EQ(hashes[i], Hash64(want, spans[i].bytes)) << i;
    EXPECT_EQ(landed[i], std::string(want, spans[i].bytes)) << i;
  }
  EXPECT_EQ(std::memcmp(direct.p, image_.data() + kAOffset, kChecksumChunk), 0);
  EXPECT_EQ(std::memcmp(unaligned.p + 1, image_.data() + kBOffset, kB), 0);
  // a's checksum from its two chunk hashes, as a resharding reader checks.
  const uint64_t a_chunks[] = {hashes[1], hashes[0]};
  EXPECT_EQ(CombineChunkHashes(a_chunks), metas_[0].checksum());
}

TEST_F(FileRestorerTest, ReadSpansRefusesBadSpansAndNamesAShortFile) {
  std::vector<uint64_t> hashes(1);
  auto read = [&](FileRestorer::Span sp, uint64_t image_bytes) {
    std::vector<FileRestorer::Span> spans = {sp};
    return restorer_.ReadSpans(
        path_, image_bytes, spans, hashes,
        [](size_t, const char*, DeviceCopyBatch*) { return absl::OkStatus(); });
  };
  absl::Status s = read({kImage - 10, 20, nullptr}, kImage);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("span 0 (20 bytes at"), absl::string_view::npos)
      << s;
  // The file is shorter than the image the daemon describes.
  ASSERT_EQ(::truncate(path_.c_str(), kBOffset), 0);
  s = read({kAOffset, 4096, nullptr}, kImage);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(path_ + ": " + std::to_string(kBOffset) +
                             " bytes, expected " + std::to_string(kImage)),
            absl::string_view::npos)
      << s;
  // Overlapping spans, and a callback's error, stop the read.
  std::vector<FileRestorer::Span> two = {{kAOffset, 4096, nullptr},
                                         {kAOffset + 100, 4096, nullptr}};
  std::vector<uint64_t> h2(2);
  s = restorer_.ReadSpans(
      path_, kBOffset, two, h2,
      [](size_t, const char*, DeviceCopyBatch*) { return absl::OkStatus(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = restorer_.ReadSpans(path_, kBOffset,
                          std::span<const FileRestorer::Span>(two).first(1),
                          std::span<uint64_t>(h2).first(1),
                          [](size_t, const char*, DeviceCopyBatch*) {
                            return absl::AbortedError("stop here");
                          });
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

// Drops the file-permission overrides from the calling thread's effective
// capabilities (capset affects only that thread), so that root sees EACCES
// like an ordinary user; true if the thread now has none of them.
bool DropDacOverrideOnThisThread() {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  data[0].effective &=
      ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
  return syscall(SYS_capset, &hdr, data) == 0;
}

TEST_F(FileRestorerTest, AnUnreadableFileIsPermissionDeniedNamingThePath) {
  ASSERT_EQ(::chmod(path_.c_str(), 0), 0);
  Aligned a(kA), b(kB);
  absl::Status s;
  bool dropped = false;
  std::thread t([&] {
    dropped = DropDacOverrideOnThisThread();
    if (dropped) s = Restore(path_, kImage, a.p, b.p);
  });
  t.join();
  if (!dropped)
    GTEST_SKIP() << "cannot drop CAP_DAC_OVERRIDE on this thread (capset)";
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find(path_), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace ckpt::client
