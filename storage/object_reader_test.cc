// The parts of the Backend interface that replace path arithmetic in its
// callers: the reader opened once, Stat, LocalPath, the writer's owner and
// mode, and the forwarding BackendWrapper.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/fault_backend.h"
#include "storage/test_tempdir.h"

namespace ckpt::storage {
namespace {

std::vector<char> Pattern(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937 rng(seed);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

class ObjectReaderTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Backend> Open(std::string root = "") {
    LocalBackendOptions o;
    o.root = root.empty() ? dir_.path() + "/root" : root;
    o.use_io_uring = GetParam();
    o.queue_depth = 4;
    o.io_bytes = 64 << 10;
    auto b = NewLocalBackend(o);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  void Put(Backend& b, const std::string& key, const std::vector<char>& data,
           const WriterOptions& options = {}) {
    auto w = b.NewObjectWriter(key, data.size(), options);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  TestTempDir dir_;
};

TEST_P(ObjectReaderTest,
       ReaderOpenedOnceReadsTheRightBytesIncludingUnalignedRanges) {
  auto b = Open();
  const std::vector<char> ref = Pattern((3 << 20) + 1234, 1);
  Put(*b, "job/step-1/rank-0.shard", ref);
  auto r = b->NewObjectReader("job/step-1/rank-0.shard");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->size(), ref.size());
  // Opened once: the reader keeps reading after the name is gone.
  ASSERT_TRUE(b->Delete("job/step-1/rank-0.shard").ok());
  struct Range {
    uint64_t off, len;
  };
  for (Range g : {Range{0, ref.size()}, Range{4096, 1 << 20}, Range{1, 4095},
                  Range{4095, 8194}, Range{777, (2 << 20) + 3},
                  Range{ref.size() - 1, 1}, Range{12, 0}}) {
    std::unique_ptr<char[]> dst(new char[g.len + 1]);
    ASSERT_TRUE((*r)->ReadAt(g.off, dst.get(), g.len).ok())
        << g.off << "+" << g.len;
    EXPECT_EQ(std::memcmp(dst.get(), ref.data() + g.off, g.len), 0)
        << g.off << "+" << g.len;
  }
  // Into an aligned buffer at an aligned offset: the direct path.
  void* aligned = std::aligned_alloc(4096, 1 << 20);
  ASSERT_TRUE((*r)->ReadAt(8192, aligned, 1 << 20).ok());
  EXPECT_EQ(std::memcmp(aligned, ref.data() + 8192, 1 << 20), 0);
  std::free(aligned);
}

TEST_P(ObjectReaderTest, ReaderRefusesARangePastTheEndNamingTheKey) {
  auto b = Open();
  Put(*b, "j/short", Pattern(100, 2));
  auto r = b->NewObjectReader("j/short");
  ASSERT_TRUE(r.ok());
  char buf[64];
  absl::Status s = (*r)->ReadAt(90, buf, 20);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(std::string(s.message()).find("j/short"), std::string::npos) << s;
}

TEST_P(ObjectReaderTest, MissingObjectIsNotFoundForReaderAndStat) {
  auto b = Open();
  EXPECT_EQ(b->NewObjectReader("j/none").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Stat("j/none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(b->Stat("../x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ObjectReaderTest, StatReportsSizeAndOwner) {
  auto b = Open();
  Put(*b, "j/k", Pattern(5000, 3));
  auto info = b->Stat("j/k");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 5000u);
  ASSERT_TRUE(info->owner_uid.has_value());
  EXPECT_EQ(*info->owner_uid, geteuid());
  EXPECT_EQ(*b->ObjectSize("j/k"), 5000u);
}

TEST_P(ObjectReaderTest, LocalPathIsAbsoluteEvenForARelativeRoot) {
  TestTempDir cwd;
  std::filesystem::path old = std::filesystem::current_path();
  std::filesystem::current_path(cwd.path());
  auto b = Open("rel/root/");
  std::filesystem::current_path(old);
  Put(*b, "job/x", Pattern(10, 4));
  std::optional<std::string> p = b->LocalPath("job/x");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, cwd.path() + "/rel/root/job/x");
  EXPECT_TRUE(std::filesystem::exists(*p));
  EXPECT_FALSE(b->LocalPath("../etc/passwd").has_value());
}

TEST_P(ObjectReaderTest, OwnerAndModeAreAppliedBeforeTheObjectIsVisible) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a file to uid 65534 needs root";
  auto b = Open();
  const std::vector<char> data = Pattern(8192, 5);
  WriterOptions o;
  o.owner_uid = 65534;
  o.mode = 0640;
  auto w = b->NewObjectWriter("job/owned", data.size(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
  // The temp file already carries both before the rename makes it visible.
  int tmp_files = 0;
  for (auto& e :
       std::filesystem::directory_iterator(dir_.path() + "/root/job")) {
    struct stat st;
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u) << e.path();
    EXPECT_EQ(st.st_mode & 0777, 0640u) << e.path();
    ++tmp_files;
  }
  EXPECT_EQ(tmp_files, 1);
  ASSERT_TRUE((*w)->Commit().ok());
  struct stat st;
  ASSERT_EQ(stat(b->LocalPath("job/owned")->c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(b->Stat("job/owned")->owner_uid, 65534u);
}

// A wrapper that overrides nothing behaves as its target.
TEST_P(ObjectReaderTest, WrapperForwardsEveryCall) {
  auto b = Open();
  BackendWrapper w(b.get());
  EXPECT_EQ(w.name(), b->name());
  EXPECT_EQ(w.target(), b.get());
  const std::vector<char> data = Pattern(10000, 6);
  auto writer = w.NewObjectWriter("p/a", data.size());
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->WriteAt(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  ASSERT_TRUE(w.PutSmallObject("p/b", "small").ok());
  EXPECT_EQ(*w.List("p/"), (std::vector<std::string>{"p/a", "p/b"}));
  EXPECT_EQ(w.Stat("p/a")->size, data.size());
  EXPECT_EQ(w.LocalPath("p/a"), b->LocalPath("p/a"));
  auto r = w.NewObjectReader("p/a");
  ASSERT_TRUE(r.ok());
  std::vector<char> back(data.size());
  ASSERT_TRUE((*r)->ReadAt(0, back.data(), back.size()).ok());
  EXPECT_EQ(back, data);
  char buf[5];
  ASSERT_TRUE(w.ReadAt("p/b", 0, buf, 5).ok());
  EXPECT_EQ(std::string(buf, 5), "small");
  ASSERT_TRUE(w.Delete("p/b").ok());
  ASSERT_TRUE(w.DeletePrefix("p/").ok());
  EXPECT_TRUE(b->List("")->empty());
  EXPECT_EQ(w.stats().objects_committed, b->stats().objects_committed);
  EXPECT_GE(w.stats().bytes_read, data.size());
}

TEST_P(ObjectReaderTest, FaultBackendReaderFailsAfterASimulatedCrash) {
  auto b = Open();
  FaultInjectionBackend fault(b.get());
  Put(fault, "j/a", Pattern(100, 7));
  auto r = fault.NewObjectReader("j/a");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(fault.Stat("j/a")->size, 100u);
  EXPECT_EQ(fault.LocalPath("j/a"),
            b->LocalPath("j/a"));  // forwarded, not overridden
  fault.SimulateCrash();
  char buf[10];
  EXPECT_EQ((*r)->ReadAt(0, buf, 10).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fault.Stat("j/a").status().code(), absl::StatusCode::kUnavailable);
  fault.Restart();
  EXPECT_TRUE((*r)->ReadAt(0, buf, 10).ok());
}

INSTANTIATE_TEST_SUITE_P(IoPaths, ObjectReaderTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "io_uring" : "pwrite";
                         });

}  // namespace
}  // namespace ckpt::storage
