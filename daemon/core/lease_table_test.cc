// LeaseTable alone: leases found only by their own (job, rank, kind), a
// lease refused for a caller that has exited, holders seen to die through
// their pidfds, and FILE restores' keys.
#include "daemon/core/lease_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "gtest/gtest.h"

namespace ckpt::daemon {
namespace {

// A child that waits in pause() until killed: a live holder.
class Child {
 public:
  Child() {
    pid_ = fork();
    if (pid_ == 0) {
      for (;;) pause();
    }
  }
  ~Child() { Kill(); }
  pid_t pid() const { return pid_; }
  // SIGKILL and reap: returns once the process has exited.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

Lease MakeLease(std::string job, uint32_t rank, bool write, pid_t pid) {
  Lease l;
  l.job = std::move(job);
  l.rank = rank;
  l.slot = 1;
  l.step = 7;
  l.write = write;
  l.pid = pid;
  return l;
}

bool FdOpen(int fd) { return fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

TEST(LeaseTableTest, ALeaseIsFoundOnlyForItsOwnJobRankAndKind) {
  LeaseTable t;
  absl::StatusOr<uint64_t> id = t.Add(MakeLease("j", 3, true, 0));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(t.FindFor(*id, "j", 3, /*write=*/true), nullptr);
  EXPECT_EQ(t.FindFor(*id, "j", 3, /*write=*/false), nullptr);
  EXPECT_EQ(t.FindFor(*id, "k", 3, true), nullptr);
  EXPECT_EQ(t.FindFor(*id, "j", 4, true), nullptr);
  EXPECT_EQ(t.FindFor(*id + 1, "j", 3, true), nullptr);
  EXPECT_TRUE(t.AnyForJob("j"));
  EXPECT_FALSE(t.AnyForJob("k"));
  std::optional<Lease> gone = t.Remove(*id);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->step, 7u);
  EXPECT_FALSE(t.Remove(*id).has_value()) << "removed twice";
  EXPECT_EQ(t.Find(*id), nullptr);
  EXPECT_FALSE(t.AnyForJob("j"));
}

TEST(LeaseTableTest, ACallerThatHasExitedGetsNoLeaseAndChangesNothing) {
  Child c;
  const pid_t pid = c.pid();
  ASSERT_GT(pid, 0);
  c.Kill();  // exited and reaped: its pid names nobody
  LeaseTable t;
  absl::StatusOr<uint64_t> id = t.Add(MakeLease("j", 0, true, pid));
  ASSERT_EQ(id.status().code(), absl::StatusCode::kAborted) << id.status();
  EXPECT_NE(id.status().message().find(std::to_string(pid)), std::string::npos)
      << id.status();
  EXPECT_FALSE(t.AnyForJob("j"));
  EXPECT_TRUE(t.DeadHolders().empty());
}

TEST(LeaseTableTest, AHolderThatDiesIsReportedUntilItsLeaseIsRemoved) {
  Child live, dying;
  LeaseTable t;
  absl::StatusOr<uint64_t> a = t.Add(MakeLease("j", 0, true, live.pid()));
  absl::StatusOr<uint64_t> b = t.Add(MakeLease("j", 1, false, dying.pid()));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(t.HolderPid(*b), dying.pid());
  EXPECT_TRUE(t.DeadHolders().empty());
  const int pidfd = t.Find(*b)->pidfd;
  ASSERT_GE(pidfd, 0);
  dying.Kill();  // returns once it has exited: its pidfd is readable
  EXPECT_EQ(t.DeadHolders(), std::vector<uint64_t>{*b});
  EXPECT_EQ(t.DeadHolders(), std::vector<uint64_t>{*b}) << "polling consumed";
  ASSERT_TRUE(t.Remove(*b).has_value());
  EXPECT_FALSE(FdOpen(pidfd)) << "Remove left the pidfd open";
  EXPECT_TRUE(t.DeadHolders().empty());
  EXPECT_EQ(t.HolderPid(*b), 0);
  EXPECT_EQ(t.HolderPid(*a), live.pid());
}

TEST(LeaseTableTest, FileKeysAreHeldExactlyOrUnderAPrefix) {
  LeaseTable t;
  Lease l = MakeLease("j", 0, false, 0);
  l.file_key = "j/step-00000000000000000010/rank-00000.ckpt";
  ASSERT_TRUE(t.Add(l).ok());
  ASSERT_TRUE(t.Add(MakeLease("j", 1, false, 0)).ok());  // a slot's lease
  EXPECT_TRUE(t.HoldsFile(l.file_key, /*prefix=*/false));
  EXPECT_FALSE(
      t.HoldsFile("j/step-00000000000000000010/rank-00001.ckpt", false));
  EXPECT_TRUE(t.HoldsFile("j/step-00000000000000000010/", /*prefix=*/true));
  EXPECT_TRUE(t.HoldsFile("j/", true));
  EXPECT_FALSE(t.HoldsFile("j/step-00000000000000000011/", true));
  EXPECT_FALSE(t.HoldsFile("j/step-00000000000000000010/", false))
      << "a directory is not the file";
  EXPECT_FALSE(t.HoldsFile("", false)) << "a slot's lease holds no file";
}

TEST(LeaseTableTest, DestroyingTheTableClosesEveryPidfd) {
  Child c;
  int pidfd = -1;
  {
    LeaseTable t;
    absl::StatusOr<uint64_t> id = t.Add(MakeLease("j", 0, true, c.pid()));
    ASSERT_TRUE(id.ok()) << id.status();
    pidfd = t.Find(*id)->pidfd;
    ASSERT_TRUE(FdOpen(pidfd));
  }
  EXPECT_FALSE(FdOpen(pidfd));
}

}  // namespace
}  // namespace ckpt::daemon
