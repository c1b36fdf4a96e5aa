#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/io_queue.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) v[i] = static_cast<char>(rng());
  return v;
}

struct AlignedDeleter {
  void operator()(char* p) const { std::free(p); }
};
std::unique_ptr<char, AlignedDeleter> AlignedAlloc(size_t n) {
  return std::unique_ptr<char, AlignedDeleter>(
      static_cast<char*>(std::aligned_alloc(4096, n)));
}

// Every test runs with io_uring and with the pread/pwrite fallback.
class LocalBackendTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Backend> Open(unsigned depth = 8,
                                uint64_t io_bytes = 1 << 20) {
    LocalBackendOptions o;
    o.root = dir_.path() + "/root";
    o.use_io_uring = GetParam();
    o.queue_depth = depth;
    o.io_bytes = io_bytes;
    absl::StatusOr<std::unique_ptr<Backend>> b = NewLocalBackend(o);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  void WriteObject(Backend& b, const std::string& key, const char* data,
                   uint64_t size) {
    auto w = b.NewObjectWriter(key, size);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->WriteAt(0, data, size).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  ckpt::testing::TempDir dir_;
};

TEST_P(LocalBackendTest, NameReportsTheIoPath) {
  EXPECT_EQ(Open()->name(), GetParam() ? "io_uring" : "pwrite");
}

TEST_P(LocalBackendTest, RoundTripsAMultiMiBObjectFromAnAlignedBuffer) {
  auto b = Open();
  const size_t n = (24 << 20) + 8192;
  auto src = AlignedAlloc(n);
  std::vector<char> ref = RandomBytes(n, 1);
  std::memcpy(src.get(), ref.data(), n);
  WriteObject(*b, "job/step-1/rank-0.shard", src.get(), n);
  EXPECT_EQ(*b->ObjectSize("job/step-1/rank-0.shard"), n);
  auto dst = AlignedAlloc(n);
  ASSERT_TRUE(b->ReadAt("job/step-1/rank-0.shard", 0, dst.get(), n).ok());
  EXPECT_EQ(std::memcmp(dst.get(), ref.data(), n), 0);
}

TEST_P(LocalBackendTest, RoundTripsFromAnUnalignedBufferAndOffset) {
  auto b = Open();
  const size_t n = (5 << 20) + 7777;
  std::vector<char> ref = RandomBytes(n + 13, 2);
  WriteObject(*b, "a/b/c", ref.data() + 13, n);
  std::vector<char> back(n + 5);
  ASSERT_TRUE(b->ReadAt("a/b/c", 0, back.data() + 5, n).ok());
  EXPECT_EQ(std::memcmp(back.data() + 5, ref.data() + 13, n), 0);
  // A read that starts mid-block into an aligned buffer takes the mixed path.
  auto dst = AlignedAlloc(1 << 20);
  ASSERT_TRUE(b->ReadAt("a/b/c", 4096 + 100, dst.get(), 1 << 20).ok());
  EXPECT_EQ(std::memcmp(dst.get(), ref.data() + 13 + 4096 + 100, 1 << 20), 0);
}

TEST_P(LocalBackendTest, ManyWritesInFlightLandAtTheirOffsets) {
  auto b = Open(/*depth=*/16, /*io_bytes=*/64 << 10);
  const size_t piece = 256 << 10, pieces = 64, n = piece * pieces;
  auto src = AlignedAlloc(n);
  std::vector<char> ref = RandomBytes(n, 3);
  std::memcpy(src.get(), ref.data(), n);
  auto w = b->NewObjectWriter("many", n);
  ASSERT_TRUE(w.ok());
  for (size_t i = 0; i < pieces; ++i) {
    size_t p = (i * 37) % pieces;  // out of order
    ASSERT_TRUE((*w)->WriteAt(p * piece, src.get() + p * piece, piece).ok());
  }
  ASSERT_TRUE((*w)->Commit().ok());
  std::vector<char> back(n);
  ASSERT_TRUE(b->ReadAt("many", 0, back.data(), n).ok());
  EXPECT_EQ(back, ref);
  EXPECT_EQ(b->stats().bytes_written, n);
  EXPECT_EQ(b->stats().objects_committed, 1u);
}

TEST_P(LocalBackendTest, WritesFromRegisteredMemoryUseTheRegisteredPath) {
  auto b = Open(8, 1 << 20);
  const size_t n = 6 << 20;
  char* region = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  std::vector<char> ref = RandomBytes(n, 4);
  std::memcpy(region, ref.data(), n);
  ASSERT_TRUE(b->RegisterMemory(region, n).ok());
  WriteObject(*b, "reg/one", region, n);
  WriteObject(*b, "reg/two", region + 4096,
              n - 8192);  // inside the region, offset
  std::memset(region, 0, n);
  ASSERT_TRUE(b->ReadAt("reg/one", 0, region, n).ok());  // read_fixed into it
  EXPECT_EQ(std::memcmp(region, ref.data(), n), 0);
  b->UnregisterMemory(region);
  std::vector<char> back(n - 8192);
  ASSERT_TRUE(b->ReadAt("reg/two", 0, back.data(), back.size()).ok());
  EXPECT_EQ(std::memcmp(back.data(), ref.data() + 4096, back.size()), 0);
  EXPECT_FALSE(b->RegisterMemory(nullptr, 0).ok());
  munmap(region, n);
}

TEST(RegisteredTable, RequestsNeverCrossAPieceEnd) {
  RegisteredTable t;
  static char memory[3 * 4096];
  t.pieces = {{memory, 4096}, {memory + 4096, 8192}};
  EXPECT_EQ(t.Find(memory + 100, 100), 0);
  EXPECT_EQ(t.Find(memory + 4000, 200), -1);  // straddles two pieces
  EXPECT_EQ(t.Find(memory + 4096, 8192), 1);
  EXPECT_EQ(t.RoomInPiece(memory + 4000), 96u);
  EXPECT_EQ(t.RoomInPiece(memory + 4096), 8192u);
  static char other[16];
  EXPECT_EQ(t.Find(other, 1), -1);
  EXPECT_EQ(t.RoomInPiece(other), 0u);
}

TEST_P(LocalBackendTest, ObjectIsVisibleOnlyAfterCommit) {
  auto b = Open();
  std::vector<char> data = RandomBytes(10000, 5);
  auto w = b->NewObjectWriter("job/x", data.size());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
  EXPECT_EQ(b->ObjectSize("job/x").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(b->List("job/")->empty());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(*b->List("job/"), std::vector<std::string>{"job/x"});
  EXPECT_FALSE((*w)->Commit().ok());  // a writer commits once
}

TEST_P(LocalBackendTest, AbortAndDestructionLeaveNothingBehind) {
  auto b = Open();
  std::vector<char> data = RandomBytes(8192, 6);
  {
    auto w = b->NewObjectWriter("j/aborted", data.size());
    ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
    (*w)->Abort();
    auto w2 = b->NewObjectWriter("j/dropped", data.size());
    ASSERT_TRUE((*w2)->WriteAt(0, data.data(), data.size()).ok());
  }
  EXPECT_TRUE(b->List("")->empty());
  for (auto& e :
       std::filesystem::recursive_directory_iterator(dir_.path() + "/root"))
    EXPECT_FALSE(e.is_regular_file()) << e.path();
}

TEST_P(LocalBackendTest, NewBackendRemovesLeftoverTmpFilesWhenAsked) {
  auto b = Open();
  std::filesystem::create_directories(dir_.path() + "/root/job/step-1");
  std::ofstream(dir_.path() + "/root/job/step-1/rank-0.shard.tmp.123-abc-0")
      << "partial";
  std::ofstream(dir_.path() + "/root/job/step-1/rank-1.shard") << "done";
  EXPECT_EQ(*b->List(""), std::vector<std::string>{"job/step-1/rank-1.shard"});
  LocalBackendOptions o;
  o.root = dir_.path() + "/root";
  o.use_io_uring = GetParam();
  o.remove_tmp_files = true;  // what the daemon that owns the root asks
  auto again = NewLocalBackend(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(std::filesystem::exists(
      dir_.path() + "/root/job/step-1/rank-0.shard.tmp.123-abc-0"));
  EXPECT_TRUE(
      std::filesystem::exists(dir_.path() + "/root/job/step-1/rank-1.shard"));
}

// A reader opening a root with default options (a tool, a test, a
// library user) must never remove a live writer's temp file: the default
// leaves leftovers alone, only the root's owner asks for the cleanup.
TEST_P(LocalBackendTest, DefaultOptionsNeverRemoveAWriteInFlight) {
  auto writer = Open();
  auto in_flight = writer->NewObjectWriter("job/step-1/rank-0.shard", 4096);
  ASSERT_TRUE(in_flight.ok()) << in_flight.status();
  auto reader = Open();
  std::vector<char> data(4096, 'x');
  ASSERT_TRUE((*in_flight)->WriteAt(0, data.data(), data.size()).ok());
  EXPECT_TRUE((*in_flight)->Commit().ok()) << "the writer's temp file went";
  EXPECT_EQ(*reader->List(""),
            std::vector<std::string>{"job/step-1/rank-0.shard"});
}

TEST_P(LocalBackendTest, TaggedBackendRemovesOnlyItsOwnLeftovers) {
  LocalBackendOptions o;
  o.root = dir_.path() + "/root";
  o.use_io_uring = GetParam();
  o.remove_tmp_files = true;  // as each node's daemon asks
  o.tmp_tag = "b";
  auto b = NewLocalBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  auto in_flight = (*b)->NewObjectWriter("job/step-1/rank-1.b.shard", 4096);
  ASSERT_TRUE(in_flight.ok());
  const std::string dir = dir_.path() + "/root/job/step-1/";
  std::ofstream(dir + "rank-0.a.shard.tmp.a.12-ab-0") << "a's leftover";
  std::ofstream(dir + "rank-2.ab.shard.tmp.a.b.13-ab-0") << "node a.b's";
  std::ofstream(dir + "MANIFEST.global.tmp.14-ab-0") << "untagged";
  o.tmp_tag = "a";
  ASSERT_TRUE(NewLocalBackend(o).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "rank-0.a.shard.tmp.a.12-ab-0"));
  EXPECT_TRUE(std::filesystem::exists(dir + "rank-2.ab.shard.tmp.a.b.13-ab-0"));
  EXPECT_TRUE(std::filesystem::exists(dir + "MANIFEST.global.tmp.14-ab-0"));
  std::vector<char> data(4096, 'x');
  ASSERT_TRUE((*in_flight)->WriteAt(0, data.data(), data.size()).ok());
  EXPECT_TRUE((*in_flight)->Commit().ok()) << "node b's write in flight";
}

// A root users can write to (a team's shared directory): a symlink they
// plant inside it must not redirect the daemon's writes or reads.
TEST_P(LocalBackendTest, SymlinkInsideTheRootIsNeverFollowed) {
  auto b = Open();
  const std::string victim = dir_.path() + "/victim";
  std::filesystem::create_directories(victim);
  std::ofstream(victim + "/secret") << "not yours";
  std::filesystem::create_directories(dir_.path() + "/root/job");
  std::filesystem::create_directory_symlink(victim,
                                            dir_.path() + "/root/job/step-1");
  auto w = b->NewObjectWriter("job/step-1/rank-0.shard", 4096);
  EXPECT_FALSE(w.ok()) << "wrote through a symlinked directory";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(victim),
                          std::filesystem::directory_iterator()),
            1);
  std::filesystem::create_symlink(victim + "/secret",
                                  dir_.path() + "/root/job/leak");
  auto r = b->NewObjectReader("job/leak");
  EXPECT_FALSE(r.ok()) << "read through a symlink";
}

// Runs fn in a child process as uid/gid 1000 (a real unprivileged user);
// true if it returned true.
bool RunAsUser(const std::function<bool()>& fn) {
  pid_t child = fork();
  if (child == 0) {
    if (setresgid(1000, 1000, 1000) != 0 || setresuid(1000, 1000, 1000) != 0)
      _exit(2);
    _exit(fn() ? 0 : 1);
  }
  int status = 0;
  return child > 0 && waitpid(child, &status, 0) == child &&
         WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A shared root users can write to (a team's NFS directory).
// User 1000 plants `<job>/` and `<job>/step-…` symlinks into another job's
// step directory (shard names do not include the job); the root daemon's
// writes, deletes and stats through them are refused naming the path, and
// the other job's shard is untouched.
TEST_P(LocalBackendTest, UserPlantedSymlinksNeverRedirectWritesOrDeletes) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to plant the links as uid 1000";
  auto b = Open();
  const std::string root = dir_.path() + "/root";
  ASSERT_EQ(chmod(root.c_str(), 0777), 0);
  const std::string shard = "rank-00000.a.shard";
  std::vector<char> secret(8192, 's');
  WriteObject(*b, "victim/step-00000001/" + shard, secret.data(),
              secret.size());
  const std::string victim_file = root + "/victim/step-00000001/" + shard;
  ASSERT_TRUE(RunAsUser([&] {
    return mkdir((root + "/mallory").c_str(), 0755) == 0 &&
           symlink((root + "/victim/step-00000001").c_str(),
                   (root + "/mallory/step-00000001").c_str()) == 0 &&
           symlink("victim", (root + "/alias").c_str()) == 0;
  })) << "uid 1000 could not plant the links";

  std::vector<char> junk(4096, 'j');
  for (const std::string job : {"mallory", "alias"}) {
    const std::string key = job + "/step-00000001/" + shard;
    auto w = b->NewObjectWriter(key, junk.size());
    ASSERT_FALSE(w.ok()) << key << ": wrote through a planted symlink";
    EXPECT_NE(std::string(w.status().message()).find(root + "/" + job),
              std::string::npos)
        << w.status();
    absl::Status del = b->Delete(key);
    EXPECT_FALSE(del.ok()) << key << ": deleted through a planted symlink";
    EXPECT_NE(std::string(del.message()).find(root + "/" + job),
              std::string::npos)
        << del;
    EXPECT_FALSE(b->Stat(key).ok())
        << key << ": stat through a planted symlink";
    EXPECT_FALSE(b->NewObjectReader(key).ok())
        << key << ": read through a planted symlink";
    (void)b->DeletePrefix(job + "/step-00000001/");
    (void)b->DeletePrefix(job + "/");
    ASSERT_TRUE(std::filesystem::exists(victim_file))
        << "deleted through " << job;
  }
  EXPECT_EQ(Slurp(victim_file), std::string(secret.begin(), secret.end()));
  EXPECT_TRUE(std::filesystem::is_symlink(root + "/alias"))
      << "the link itself may stay";
}

// Also: a user who can write to the shared root makes
// `<job>/step-…/` before the job's first save. A shard written there could
// be renamed over or unlinked by that user (the directory's owner), so the
// write is refused naming the directory, and nothing is created in it.
// Directories the job's own uid made are used.
TEST_P(LocalBackendTest, DirectoryPlantedByAnotherUserIsNotWrittenInto) {
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to plant the directory as uid 1000";
  auto b = Open();
  const std::string root = dir_.path() + "/root";
  ASSERT_EQ(chmod(root.c_str(), 0777), 0);
  ASSERT_TRUE(RunAsUser([&] {
    return mkdir((root + "/joba").c_str(), 0755) == 0 &&
           mkdir((root + "/joba/step-00000001").c_str(), 0777) == 0;
  })) << "uid 1000 could not plant the directories";
  const std::string key = "joba/step-00000001/rank-00000.shard";
  std::vector<char> data(4096, 'a');
  WriterOptions wo;
  wo.owner_uid = 2000;  // job A's uid: not the planter's
  auto w = b->NewObjectWriter(key, data.size(), wo);
  ASSERT_FALSE(w.ok()) << "wrote into a directory uid 1000 owns";
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition)
      << w.status();
  EXPECT_NE(std::string(w.status().message()).find(root + "/joba"),
            std::string::npos)
      << w.status();
  EXPECT_TRUE(std::filesystem::is_empty(root + "/joba/step-00000001"));
  // The same directories are the job's own when the job runs as uid 1000.
  wo.owner_uid = 1000;
  auto own = b->NewObjectWriter(key, data.size(), wo);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE((*own)->WriteAt(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*own)->Commit().ok());
}

TEST_P(LocalBackendTest, ReadPastTheEndIsDataLossNamingThePath) {
  auto b = Open();
  ASSERT_TRUE(b->PutSmallObject("small", "hello").ok());
  char buf[16];
  absl::Status s = b->ReadAt("small", 2, buf, 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(std::string(s.message()).find("root/small"), std::string::npos)
      << s;
  ASSERT_TRUE(b->ReadAt("small", 1, buf, 4).ok());
  EXPECT_EQ(std::string(buf, 4), "ello");
  EXPECT_EQ(b->ReadAt("missing", 0, buf, 1).code(),
            absl::StatusCode::kNotFound);
}

TEST_P(LocalBackendTest, WriteOutsideTheObjectIsRefused) {
  auto b = Open();
  char buf[10] = {};
  auto w = b->NewObjectWriter("k", 8);
  EXPECT_EQ((*w)->WriteAt(4, buf, 5).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteAt(UINT64_MAX, buf, 2).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(LocalBackendTest, ListIsSortedAndDeletePrefixRemovesEmptiedDirs) {
  auto b = Open();
  for (const char* k :
       {"j/step-2/b", "j/step-1/a", "j/step-2/a", "k/step-1/a", "j/step-10/a"})
    ASSERT_TRUE(b->PutSmallObject(k, k).ok());
  EXPECT_EQ(*b->List("j/step-1"),
            (std::vector<std::string>{"j/step-1/a", "j/step-10/a"}));
  EXPECT_EQ(*b->List("j/step-2/"),
            (std::vector<std::string>{"j/step-2/a", "j/step-2/b"}));
  EXPECT_EQ(b->List("").value().size(), 5u);
  ASSERT_TRUE(b->DeletePrefix("j/step-2/").ok());
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/root/j/step-2"));
  EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/root/j/step-1"));
  ASSERT_TRUE(b->Delete("j/step-1/a").ok());
  ASSERT_TRUE(b->Delete("j/step-1/a").ok());  // absent is fine
  EXPECT_EQ(*b->List("j/"), std::vector<std::string>{"j/step-10/a"});
}

TEST_P(LocalBackendTest, KeysThatEscapeTheRootAreRefused) {
  auto b = Open();
  for (const char* k :
       {"", "/etc/passwd", "a/../../x", "a//b", "./a", "a/b.tmp.1", "a/"}) {
    EXPECT_EQ(b->PutSmallObject(k, "x").code(),
              absl::StatusCode::kInvalidArgument)
        << k;
  }
  EXPECT_EQ(b->List("../").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(LocalBackendTest, ZeroByteObjectCommits) {
  auto b = Open();
  auto w = b->NewObjectWriter("empty", 0);
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(*b->ObjectSize("empty"), 0u);
}

TEST_P(LocalBackendTest, ReaderOpenedWithoutCleanupKeepsInFlightTmpFiles) {
  auto b = Open();
  auto w = b->NewObjectWriter("job/in-flight", 4096);
  ASSERT_TRUE(w.ok());
  LocalBackendOptions o;
  o.root = dir_.path() + "/root";
  o.remove_tmp_files = false;
  ASSERT_TRUE(NewLocalBackend(o).ok());
  std::vector<char> data(4096, 'x');
  ASSERT_TRUE((*w)->WriteAt(0, data.data(), data.size()).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(*b->ObjectSize("job/in-flight"), 4096u);
}

TEST_P(LocalBackendTest,
       ObjectLargerThanTheFileSystemFailsAtOpenAndLeavesNothing) {
  auto b = Open();
  auto w = b->NewObjectWriter("job/huge", 1ull << 52);
  EXPECT_FALSE(w.ok());
  EXPECT_NE(std::string(w.status().message()).find("job/huge.tmp."),
            std::string::npos)
      << w.status();
  for (auto& e :
       std::filesystem::recursive_directory_iterator(dir_.path() + "/root"))
    EXPECT_FALSE(e.is_regular_file()) << e.path();
}

TEST_P(LocalBackendTest, ConcurrentWritersShareRegisteredMemory) {
  auto b = Open(4, 256 << 10);
  const size_t per = 4 << 20, threads = 4;
  auto region = AlignedAlloc(per * threads);
  std::vector<char> ref = RandomBytes(per * threads, 9);
  std::memcpy(region.get(), ref.data(), ref.size());
  ASSERT_TRUE(b->RegisterMemory(region.get(), per * threads).ok());
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round)
        WriteObject(*b, "c/" + std::to_string(t) + "-" + std::to_string(round),
                    region.get() + t * per, per);
    });
  }
  for (auto& w : workers) w.join();
  b->UnregisterMemory(region.get());
  EXPECT_EQ(b->List("c/")->size(), threads * 3);
  std::vector<char> back(per);
  for (size_t t = 0; t < threads; ++t) {
    ASSERT_TRUE(
        b->ReadAt("c/" + std::to_string(t) + "-2", 0, back.data(), per).ok());
    EXPECT_EQ(std::memcmp(back.data(), ref.data() + t * per, per), 0) << t;
  }
}

// KiB of pages pinned by this process (io_uring registered buffers count).
uint64_t VmPinKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmPin:", 0) == 0) return std::stoull(line.substr(6));
  return 0;
}

// Idle rings kept the registered buffers (pinned shm pages) of
// a region after UnregisterMemory, until borrowed again; a deleted arena's
// pages were never freed.
TEST(RingPool, UnregisterReleasesThePagesIdleAndBorrowedRingsPinned) {
  RingPool pool(4, 8);
  if (!pool.Probe()) GTEST_SKIP() << "no io_uring";
  const size_t n = 32 << 20;
  char* region = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE,
                                         MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  std::memset(region, 1, n);
  const uint64_t before = VmPinKiB();
  ASSERT_TRUE(pool.Register(region, n).ok());
  {
    // Two rings at once, so two go back idle with the region registered.
    std::unique_ptr<Ring> a = pool.Borrow(), b = pool.Borrow();
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    pool.Return(std::move(a));
    pool.Return(std::move(b));
  }
  if (VmPinKiB() < before + n / 1024)
    GTEST_SKIP() << "VmPin does not count io_uring buffers here";
  pool.Unregister(region);
  EXPECT_EQ(VmPinKiB(), before)
      << "idle rings still pin the unregistered region";

  ASSERT_TRUE(pool.Register(region, n).ok());
  std::unique_ptr<Ring> held = pool.Borrow();  // an IoQueue in flight
  ASSERT_NE(held, nullptr);
  pool.Unregister(region);
  pool.Return(std::move(held));
  EXPECT_EQ(VmPinKiB(), before)
      << "a ring returned after Unregister still pins the region";
  munmap(region, n);
}

INSTANTIATE_TEST_SUITE_P(IoPaths, LocalBackendTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "io_uring" : "pwrite";
                         });

}  // namespace
}  // namespace ckpt::storage
