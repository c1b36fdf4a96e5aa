#include "shm/arena.h"

#include <acl/libacl.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/acl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "shm/huge_pages.h"
#include "tests/private_mounts.h"
#include "tests/smaps.h"

namespace ckpt::shm {
namespace {

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "/ckpt_test." + std::to_string(::getpid()) + "." +
         std::to_string(counter++);
}

class ArenaTest : public ::testing::Test {
 protected:
  ArenaOptions Options(uint64_t slot_bytes = 3 << 20, uint32_t num_slots = 2) {
    ArenaOptions o;
    o.name = UniqueName();
    names_.push_back(o.name);
    o.job = "job-a";
    o.rank = 1;
    o.world_size = 4;
    o.slot_bytes = slot_bytes;
    o.num_slots = num_slots;
    o.user_uid = ::geteuid();
    return o;
  }
  void TearDown() override {
    for (const auto& n : names_)
      (void)Arena::Unlink(n);  // most are gone already
  }
  // Opens the segment behind the test's back, as a scribbler would.
  char* MapRaw(const std::string& name, size_t bytes) {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    EXPECT_GE(fd, 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    EXPECT_NE(p, MAP_FAILED);
    return static_cast<char*>(p);
  }
  std::vector<std::string> names_;
};

TEST_F(ArenaTest, CreateRoundsSlotsAndAttachSeesTheSameBytes) {
  ArenaOptions o = Options(3 << 20, 3);
  auto created = Arena::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  Arena& d = **created;
  EXPECT_EQ(d.slot_bytes(), 4u << 20);
  EXPECT_EQ(d.num_slots(), 3u);
  EXPECT_EQ(d.size(), Arena::ArenaBytes(3 << 20, 3));
  EXPECT_EQ(d.size(), kSlotAlign + 3 * (4u << 20));
  EXPECT_EQ(d.slot_offset(0), kSlotAlign);
  EXPECT_EQ(d.header().magic, kArenaMagic);
  EXPECT_STREQ(d.header().job, "job-a");

  auto attached = Arena::Attach(o.name, d.size(), Arena::SlotsOffset());
  ASSERT_TRUE(attached.ok()) << attached.status();
  Arena& c = **attached;
  EXPECT_EQ(c.num_slots(), 3u);
  EXPECT_EQ(c.slot_bytes(), d.slot_bytes());
  // Client writes into the slots are seen by the daemon and vice versa.
  std::memset(c.slot_data(2), 0x5a, c.slot_bytes());
  EXPECT_EQ(d.slot_data(2)[0], 0x5a);
  EXPECT_EQ(d.slot_data(2)[d.slot_bytes() - 1], 0x5a);
  d.SetSlotState(1, SlotState::kStaged, 42, 7, 8192);
  EXPECT_EQ(c.slot_state(1), SlotState::kStaged);
  EXPECT_EQ(c.header().slots[1].step.load(), 42u);
  EXPECT_EQ(c.header().slots[1].image_bytes.load(), 8192u);
  // The client's header and slots are contiguous.
  EXPECT_EQ(c.slot_data(0), c.base() + kSlotAlign);
}

TEST_F(ArenaTest, CreateRefusesAnExistingName) {
  ArenaOptions o = Options();
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Arena::Create(o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists) << b.status();
}

TEST_F(ArenaTest, CreateRejectsBadSlotCounts) {
  for (uint32_t n : {0u, 1u, kMaxSlots + 1}) {
    auto a = Arena::Create(Options(1 << 20, n));
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_NE(a.status().message().find("num_slots"), absl::string_view::npos);
  }
}

TEST_F(ArenaTest, SegmentHasMode0600AndTheDaemonsOwner) {
  ArenaOptions o = Options();
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + o.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
}

TEST_F(ArenaTest, ClientHeaderMappingIsReadOnly) {
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  auto c = Arena::Attach(o.name, (*d)->size(), Arena::SlotsOffset());
  ASSERT_TRUE(c.ok()) << c.status();
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGSEGV, SIG_DFL);  // not a sanitizer's handler: die of the signal
    volatile char* header = (*c)->base();
    header[0] = 1;  // must fault
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus));
  EXPECT_EQ(WTERMSIG(wstatus), SIGSEGV);
}

TEST_F(ArenaTest, ArenaLargerThanDevShmIsRefusedWithResourceExhausted) {
  struct statvfs vfs {};
  ASSERT_EQ(::statvfs("/dev/shm", &vfs), 0);
  uint64_t total = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (total == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  ASSERT_GE(total, free_bytes);
  // Bigger than the whole filesystem, so the kernel refuses before allocating.
  ArenaOptions o = Options(total / 2 + (64ull << 20), 2);
  auto a = Arena::Create(o);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted)
      << a.status();
  EXPECT_NE(a.status().message().find("/dev/shm cannot hold"),
            absl::string_view::npos);
  // Nothing is left behind.
  EXPECT_EQ(::access(("/dev/shm" + o.name).c_str(), F_OK), -1);
}

TEST_F(ArenaTest, ReattachMapsAnIntactArena) {
  ArenaOptions o = Options();
  {
    auto d = Arena::Create(o);
    ASSERT_TRUE(d.ok()) << d.status();
    std::memcpy((*d)->slot_data(1), "staged", 6);
  }
  auto r = Arena::Reattach(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::memcmp((*r)->slot_data(1), "staged", 6), 0);
  EXPECT_EQ((*r)->num_slots(), 2u);
}

TEST_F(ArenaTest, ReattachRefusesScribbledHeaderNamingTheField) {
  struct Case {
    const char* field;
    void (*scribble)(ArenaHeader*);
  };
  const Case cases[] = {
      {"magic", [](ArenaHeader* h) { h->magic ^= 1; }},
      {"slot_bytes", [](ArenaHeader* h) { h->slot_bytes += kSlotAlign; }},
      {"job", [](ArenaHeader* h) { h->job[0] = 'X'; }},
      {"rank", [](ArenaHeader* h) { h->rank = 3; }},
      {"num_slots", [](ArenaHeader* h) { h->num_slots = 3; }},
  };
  for (const Case& c : cases) {
    ArenaOptions o = Options();
    ASSERT_TRUE(Arena::Create(o).ok());
    char* raw = MapRaw(o.name, 4096);
    c.scribble(reinterpret_cast<ArenaHeader*>(raw));
    ::munmap(raw, 4096);
    auto r = Arena::Reattach(o);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss)
        << c.field << ": " << r.status();
    EXPECT_NE(r.status().message().find(c.field), absl::string_view::npos)
        << r.status();
  }
}

TEST_F(ArenaTest, ReattachRefusesATruncatedSegment) {
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok());
  int fd = ::shm_open(o.name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>((*d)->size() - kSlotAlign)), 0);
  ::close(fd);
  d->reset();
  auto r = Arena::Reattach(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("segment size"), absl::string_view::npos);
  auto c = Arena::Attach(o.name, Arena::ArenaBytes(o.slot_bytes, o.num_slots),
                         kSlotAlign);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
}

TEST_F(ArenaTest, AttachRefusesAWrongSize) {
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok());
  auto c = Arena::Attach(o.name, (*d)->size() + kSlotAlign, kSlotAlign);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
}

// Whether uid can open the segment read-write (a child process drops to it).
bool OpensAs(const std::string& name, uid_t uid) {
  pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 ||
        ::setuid(uid) != 0)
      ::_exit(2);
    int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    ::_exit(fd >= 0 ? 0 : 1);
  }
  int wstatus = 0;
  return child > 0 && ::waitpid(child, &wstatus, 0) == child &&
         WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
}

// logind's RemoveIPC deletes the /dev/shm files a user owns when the user
// logs out: the segment must stay the daemon's, the job's uid only a user.
TEST_F(ArenaTest, SegmentStaysTheDaemonsAndOnlyTheJobsUidMayOpenIt) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to open the segment as other uids";
  ArenaOptions o = Options();
  o.user_uid = 1000;
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + o.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & S_IRWXO, 0u);
  EXPECT_TRUE(OpensAs(o.name, 1000));
  EXPECT_FALSE(OpensAs(o.name, 1001));
}

// The ACL GrantSegment writes (through libacl): the owner and the job's
// uid read-write, nothing for the group or others, the mask read-write.
TEST_F(ArenaTest, SegmentAclGrantsTheOwnerAndTheJobsUidOnly) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to name another uid in the ACL";
  ArenaOptions o = Options();
  o.user_uid = 1000;
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  acl_t acl = acl_get_file(("/dev/shm" + o.name).c_str(), ACL_TYPE_ACCESS);
  if (acl == nullptr && errno == EOPNOTSUPP)
    GTEST_SKIP() << "/dev/shm has no POSIX ACLs";
  ASSERT_NE(acl, nullptr) << std::strerror(errno);
  char* text = acl_to_any_text(acl, nullptr, ',', TEXT_NUMERIC_IDS);
  ASSERT_NE(text, nullptr);
  EXPECT_STREQ(text, "user::rw-,user:1000:rw-,group::---,mask::rw-,other::---");
  acl_free(text);
  acl_free(acl);
}

// A segment someone else made under the arena's name (after a reboot, or
// after logind removed the real one), header copied, is not ours.
TEST_F(ArenaTest, ReattachAndAttachRefuseASegmentAnotherUidOwns) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to give the segment to another uid";
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const uint64_t size = (*d)->size();
  d->reset();
  ASSERT_EQ(::chown(("/dev/shm" + o.name).c_str(), 4321, 4321), 0);
  auto r = Arena::Reattach(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
      << r.status();
  EXPECT_NE(r.status().message().find("uid 4321"), absl::string_view::npos)
      << r.status();
  auto c = Arena::Attach(o.name, size, kSlotAlign);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied)
      << c.status();
  EXPECT_NE(c.status().message().find("uid 4321"), absl::string_view::npos)
      << c.status();
  // The refusal changed nothing: the squatter's segment is as it was.
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + o.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
}

// Older daemons gave arenas to the job's uid: still re-attached, and from
// then on the daemon's (logind no longer removes them).
TEST_F(ArenaTest, ReattachTakesBackAnArenaTheJobsUidOwns) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "needs root to give the segment to another uid";
  ArenaOptions o = Options();
  o.user_uid = 1000;
  ASSERT_TRUE(Arena::Create(o).ok());
  ASSERT_EQ(::chown(("/dev/shm" + o.name).c_str(), 1000, 1000), 0);
  auto r = Arena::Reattach(o);
  ASSERT_TRUE(r.ok()) << r.status();
  struct stat st {};
  ASSERT_EQ(::stat(("/dev/shm" + o.name).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_TRUE(OpensAs(o.name, 1000));
}

TEST_F(ArenaTest, ReattachAndAttachRefuseASegmentOthersMayOpen) {
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok()) << d.status();
  const uint64_t size = (*d)->size();
  d->reset();
  ASSERT_EQ(::chmod(("/dev/shm" + o.name).c_str(), 0666), 0);
  auto r = Arena::Reattach(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
      << r.status();
  EXPECT_NE(r.status().message().find("mode"), absl::string_view::npos)
      << r.status();
  auto c = Arena::Attach(o.name, size, kSlotAlign);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied)
      << c.status();
}

TEST_F(ArenaTest, UnlinkRemovesTheNameButKeepsMappings) {
  ArenaOptions o = Options();
  auto d = Arena::Create(o);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(Arena::Unlink(o.name).ok());
  EXPECT_EQ(::access(("/dev/shm" + o.name).c_str(), F_OK), -1);
  (*d)->slot_data(0)[0] = 9;  // still mapped
  EXPECT_EQ(Arena::Attach(o.name, (*d)->size(), kSlotAlign).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Arena::Unlink(o.name).code(), absl::StatusCode::kNotFound);
}

// On a tmpfs mounted huge=advise (only what asks for huge pages gets them),
// the daemon's and a client's mappings of an arena are 2 MiB pages: the
// daemon advises before it allocates (fallocate alone would allocate small
// pages), and the client advises before it touches. Run in a child with a
// private mount namespace, so that the node's /dev/shm is left alone.
TEST(ArenaHugePagesTest, SlotsAreHugePagesOnAnAdviseMount) {
  const testing::ChildResult r = testing::RunWithPrivateMounts(
      {{"/dev/shm", "huge=advise,size=256m,mode=1777"}},
      []() -> std::pair<int, std::string> {
        ArenaOptions o;
        o.name = "/ckpt_test.huge";
        o.job = "job-h";
        o.world_size = 1;
        o.slot_bytes = 4 << 20;
        o.num_slots = 2;
        o.prefault_slots = 1;  // slot 1 comes from ReserveSlots
        auto daemon = Arena::Create(o);
        if (!daemon.ok()) return {1, "Create: " + daemon.status().ToString()};
        if (absl::Status s = (*daemon)->ReserveSlots(1, 1); !s.ok())
          return {1, "ReserveSlots: " + s.ToString()};
        auto client =
            Arena::Attach(o.name, (*daemon)->size(), Arena::SlotsOffset());
        if (!client.ok()) return {1, "Attach: " + client.status().ToString()};
        std::memset((*client)->slot_data(0), 7, 2 * (4 << 20));
        const long d = testing::SmapsKb(
            (*daemon)->slot_data(0) - Arena::SlotsOffset(), "ShmemPmdMapped");
        const long c =
            testing::SmapsKb((*client)->slot_data(0), "ShmemPmdMapped");
        return {0, "daemon " + std::to_string(d) + " kB client " +
                       std::to_string(c) + " kB"};
      });
  if (r.skipped) GTEST_SKIP() << r.text;
  ASSERT_TRUE(r.exited && r.code == 0) << r.code << ": " << r.text;
  // Both slots (8 MiB) and, in the daemon's mapping, the header's 2 MiB.
  EXPECT_EQ(r.text, "daemon 10240 kB client 8192 kB");
}

// An arena made for a load from the object tier: where /dev/shm gives no
// huge pages, slot 0 is reserved (every page allocated in the segment) but
// not faulted into the creator's page tables, left for the load to write
// through the file; where it may give huge pages (an advised fault gets
// them, a write would not), slot 0 is faulted in as before. Each in a
// child with a private /dev/shm of that kind.
std::pair<int, std::string> ArenaForALoadThroughTheFile() {
  ArenaOptions o;
  o.name = "/ckpt_test.tofile";
  o.job = "job-f";
  o.world_size = 1;
  o.slot_bytes = 4 << 20;
  o.num_slots = 2;
  o.prefault_slots = 1;
  o.slot0_faulted_by_load = true;
  o.slot0_written_through_file = true;
  auto a = Arena::Create(o);
  if (!a.ok()) return {1, "Create: " + a.status().ToString()};
  char* slot = (*a)->slot_data(0);
  // Allocated in the segment: the header and slot 0, not slot 1 (mincore
  // does not count a tmpfs page that fallocate allocated and nothing wrote).
  struct stat st {};
  if (::fstat((*a)->slot_file(), &st) != 0) return {1, "fstat"};
  const uint64_t allocated = uint64_t(st.st_blocks) * 512;
  const bool reserved = allocated >= Arena::SlotsOffset() + o.slot_bytes &&
                        allocated < (*a)->size();
  const long present = testing::PresentPages(slot, o.slot_bytes);
  // What a load through the file then does, and reads back.
  std::vector<char> bytes(o.slot_bytes, 0x3c);
  const bool written = ::pwrite((*a)->slot_file(), bytes.data(), bytes.size(),
                                static_cast<off_t>((*a)->slot_offset(0))) ==
                       static_cast<ssize_t>(bytes.size());
  const bool same = std::memcmp(slot, bytes.data(), bytes.size()) == 0;
  const bool huge = absl::StartsWith(ShmHugePagesOf("/dev/shm"), "on");
  return {0, std::string(huge ? "huge: " : "") + "left " +
                 std::to_string((*a)->slot_left_to_file(0)) + " reserved " +
                 std::to_string(reserved) + " present " +
                 std::to_string(present) + " read back " +
                 std::to_string(written && same)};
}

TEST(ArenaForALoadTest, SlotZeroIsLeftToTheFileWithoutHugePages) {
  const testing::ChildResult r = testing::RunWithPrivateMounts(
      {{"/dev/shm", "huge=never,size=64m,mode=1777"}},
      ArenaForALoadThroughTheFile);
  if (r.skipped) GTEST_SKIP() << r.text;
  ASSERT_TRUE(r.exited && r.code == 0) << r.code << ": " << r.text;
  EXPECT_EQ(r.text, "left 1 reserved 1 present 0 read back 1");
}

TEST(ArenaForALoadTest, SlotZeroIsFaultedInWhereHugePagesMayCome) {
  const testing::ChildResult r = testing::RunWithPrivateMounts(
      {{"/dev/shm", "huge=advise,size=64m,mode=1777"}},
      ArenaForALoadThroughTheFile);
  if (r.skipped) GTEST_SKIP() << r.text;
  ASSERT_TRUE(r.exited && r.code == 0) << r.code << ": " << r.text;
  if (r.text.rfind("huge: ", 0) != 0)
    GTEST_SKIP() << "no transparent huge pages for shmem here: " << r.text;
  EXPECT_EQ(r.text, "huge: left 0 reserved 1 present 1024 read back 1");
}

}  // namespace
}  // namespace ckpt::shm
