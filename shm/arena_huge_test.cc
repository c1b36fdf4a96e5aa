// Arenas on hugetlbfs: 2 MiB pages where the machine has free ones, the
// /dev/shm fallback where it has none, and the same checks either way.
// The pools come from tests/huge_page_pool.h (root: reserves a few pages
// through /proc/sys/vm/nr_hugepages and gives them back; skips otherwise).
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "shm/arena.h"
#include "shm/beacon.h"
#include "shm/huge_pages.h"
#include "tests/huge_page_pool.h"
#include "tests/smaps.h"

namespace ckpt::shm {
namespace {

ArenaOptions Options(const std::string& huge_dir) {
  static std::atomic<int> counter{0};
  ArenaOptions o;
  o.name = "/ckpt_test_huge." + std::to_string(::getpid()) + "." +
           std::to_string(counter++);
  o.job = "job-h";
  o.rank = 0;
  o.world_size = 1;
  o.slot_bytes = 2 << 20;
  o.num_slots = 2;
  o.user_uid = ::geteuid();
  o.huge_dir = huge_dir;
  return o;
}

bool Exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

// 3 pages: the header's and two slots'.
constexpr long kPages = 3;

TEST(ArenaHugeTest, ArenaOnHugetlbfsIsInTwoMiBPagesForDaemonAndClient) {
  testing::HugePagePool pool(kPages);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  ArenaOptions o = Options(pool.dir());
  o.prefault_slots = 1;  // slot 1 from ReserveSlots, as ckptd does it
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*d)->huge_pages());
  EXPECT_EQ((*d)->huge_fallback(), "");
  EXPECT_EQ((*d)->name(), pool.dir() + o.name);
  ASSERT_TRUE((*d)->ReserveSlots(1, 1).ok());
  struct statfs fs {};
  ASSERT_EQ(::statfs((*d)->name().c_str(), &fs), 0);
  EXPECT_EQ(static_cast<uint64_t>(fs.f_type), HUGETLBFS_MAGIC);

  // A client attaches by the path the daemon hands out and sees its bytes.
  auto c = Arena::Attach((*d)->name(), (*d)->size(), Arena::SlotsOffset());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE((*c)->huge_pages());
  std::memset((*c)->slot_data(0), 5, 2 * (2 << 20));
  EXPECT_EQ((*d)->slot_data(1)[(2 << 20) - 1], 5);
  EXPECT_EQ(testing::SmapsKb((*d)->slot_data(0), "KernelPageSize"), 2048);
  EXPECT_EQ(testing::SmapsKb((*c)->slot_data(0), "KernelPageSize"), 2048);
  EXPECT_TRUE((*d)->CheckIntact().ok());

  // A restarted daemon finds it there, bytes and all.
  const uint64_t size = (*d)->size();
  c->reset();
  d->reset();
  auto again = Arena::Reattach(o);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->huge_pages());
  EXPECT_EQ((*again)->name(), pool.dir() + o.name);
  EXPECT_EQ((*again)->size(), size);
  EXPECT_EQ((*again)->slot_data(1)[0], 5);

  // A rename keeps the directory; an unlink removes the file.
  const std::string to = o.name + ".moved";
  ASSERT_TRUE((*again)->Rename(to).ok());
  EXPECT_EQ((*again)->name(), pool.dir() + to);
  EXPECT_FALSE(Exists(pool.dir() + o.name));
  ASSERT_TRUE(Arena::Unlink((*again)->name()).ok());
  EXPECT_FALSE(Exists(pool.dir() + to));
}

// The trainer's progress beacon lives in the arena's header region: on
// hugetlbfs it is reached through a 2 MiB mapping (hugetlbfs maps nothing
// smaller), by the trainer read-write and by the daemon read-only.
TEST(ArenaHugeTest, ProgressBeaconWorksInAHugeArena) {
  testing::HugePagePool pool(kPages);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  ArenaOptions o = Options(pool.dir());
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE((*d)->huge_pages());
  auto w = BeaconWriter::Open((*d)->name());
  ASSERT_TRUE(w.ok()) << w.status();
  (*w)->Progress(41, 1000);
  auto v = BeaconView::Open((*d)->name(), "job-h", 0);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE((*v)->IsCurrent());
  auto seen = (*v)->Read();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->step, 41);
  EXPECT_EQ(seen->progress_count, 1u);
  EXPECT_EQ((*d)->header().magic, kArenaMagic);  // the header is intact
  EXPECT_TRUE(Arena::Unlink((*d)->name()).ok());
}

TEST(ArenaHugeTest, WithoutFreeHugePagesTheArenaFallsBackToDevShm) {
  testing::HugePagePool pool(0);  // a mount, no pages reserved
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  if (testing::HugePagePool::FreePages() > 64)
    GTEST_SKIP() << "this machine has free huge pages already";
  ArenaOptions o = Options(pool.dir());
  o.slot_bytes = 256ull << 20;  // more than the free pages
  o.prefault_slots = 0;
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE((*d)->huge_pages());
  EXPECT_EQ((*d)->name(), o.name);
  EXPECT_NE((*d)->huge_fallback().find("free 2 MiB pages"), std::string::npos)
      << (*d)->huge_fallback();
  EXPECT_TRUE(Exists("/dev/shm" + o.name));
  EXPECT_FALSE(Exists(pool.dir() + o.name));  // the failed try left nothing
  ASSERT_TRUE(Arena::Unlink(o.name).ok());

  // Required: refused, naming the arena, and nothing is left anywhere.
  o.huge_required = true;
  auto refused = Arena::Create(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
      << refused.status();
  EXPECT_NE(refused.status().message().find(pool.dir() + o.name),
            std::string::npos);
  EXPECT_FALSE(Exists(pool.dir() + o.name));
  EXPECT_FALSE(Exists("/dev/shm" + o.name));
}

TEST(ArenaHugeTest, TruncatedHugeArenaIsDataLossNotACrash) {
  testing::HugePagePool pool(kPages);
  if (!pool.skip().empty()) GTEST_SKIP() << pool.skip();
  ArenaOptions o = Options(pool.dir());
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE((*d)->huge_pages());
  (*d)->slot_data(0)[0] = 1;
  // The job's uid can open and truncate it, as with /dev/shm.
  int fd = ::open((*d)->name().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 0), 0);
  ::close(fd);
  volatile char got = (*d)->slot_data(1)[4096];  // SIGBUS without the guard
  EXPECT_EQ(got, 0);
  const absl::Status s = (*d)->CheckIntact();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find((*d)->name()), std::string::npos);
  EXPECT_TRUE(Arena::Unlink((*d)->name()).ok());
}

TEST(ArenaHugeTest, AttachRefusesAPathThatIsNotOnHugetlbfs) {
  char path[] = "/tmp/ckpt_not_huge.XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 0600), 0);
  ASSERT_EQ(::ftruncate(fd, 3 * kSlotAlign), 0);
  ::close(fd);
  auto c = Arena::Attach(path, 3 * kSlotAlign, kSlotAlign);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
      << c.status();
  EXPECT_NE(c.status().message().find(path), std::string::npos);
  ::unlink(path);
  for (const char* bad : {"/dev/hugepages/../shm/x", "/a//b", "/a/"})
    EXPECT_EQ(Arena::Attach(bad, 3 * kSlotAlign, kSlotAlign).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
}

TEST(HugetlbfsTest, FindsTheMountOfTwoMiBPages) {
  const std::string info =
      "22 1 0:5 / /dev rw - devtmpfs udev rw\n"
      "30 22 0:27 / /dev/huge1g rw - hugetlbfs none rw,pagesize=1024M\n"
      "31 22 0:28 / /dev/hugepages rw,relatime - hugetlbfs hugetlbfs "
      "rw,pagesize=2M\n";
  EXPECT_EQ(FindHugetlbfs(info, true), "/dev/hugepages");
  EXPECT_EQ(FindHugetlbfs("31 22 0:28 / /hp rw - hugetlbfs none rw\n", true),
            "/hp");
  EXPECT_EQ(FindHugetlbfs("31 22 0:28 / /hp rw - hugetlbfs none rw\n", false),
            "");
  EXPECT_EQ(FindHugetlbfs("22 1 0:5 / /dev/shm rw - tmpfs tmpfs rw\n", true),
            "");
  EXPECT_EQ(CheckHugetlbfsDir("/dev/shm").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::shm
