#include "util/program.h"

#include <pthread.h>
#include <sys/resource.h>

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

bool Printed(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  ::testing::internal::CaptureStdout();
  const bool printed = PrintedVersion(static_cast<int>(argv.size()),
                                      argv.data(), "prog", "1.2.3");
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, printed ? "prog 1.2.3\n" : "");
  return printed;
}

TEST(ProgramTest, VersionIsPrintedForTheFlagAnywhereBeforeDoubleDash) {
  EXPECT_TRUE(Printed({"prog", "--version"}));
  EXPECT_TRUE(Printed({"prog", "--root", "/x", "--version"}));
  EXPECT_FALSE(Printed({"prog"}));
  EXPECT_FALSE(Printed({"prog", "--root", "/x"}));
  // After "--" it belongs to the program being launched (ckptrun).
  EXPECT_FALSE(Printed({"prog", "--", "python", "--version"}));
}

TEST(ProgramTest, BlockedSignalsAreInheritedAndWaitForSigwait) {
  sigset_t old;
  pthread_sigmask(SIG_SETMASK, nullptr, &old);
  const sigset_t set = BlockSignals({SIGUSR1, SIGUSR2});
  EXPECT_EQ(sigismember(&set, SIGUSR1), 1);
  EXPECT_EQ(sigismember(&set, SIGUSR2), 1);
  EXPECT_EQ(sigismember(&set, SIGTERM), 0);
  // A thread started afterwards has them blocked too.
  std::thread([] {
    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    EXPECT_EQ(sigismember(&mask, SIGUSR1), 1);
    EXPECT_EQ(sigismember(&mask, SIGUSR2), 1);
  }).join();
  // Sent to this thread (other tests' threads predate the mask), it stays
  // pending instead of killing the process, until sigwait takes it.
  pthread_kill(pthread_self(), SIGUSR1);
  int sig = 0;
  EXPECT_EQ(sigwait(&set, &sig), 0);
  EXPECT_EQ(sig, SIGUSR1);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// The soft limit goes up to the hard one (systemd's default soft limit is
// 1024, too few for a coordinator's direct nodes).
TEST(ProgramTest, TheDescriptorLimitIsRaisedToTheHardOne) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &before), 0);
  if (before.rlim_max < 128) GTEST_SKIP() << "hard limit " << before.rlim_max;
  rlimit low = before;
  low.rlim_cur = 64;  // lowering the soft limit needs no privilege
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  const uint64_t now = RaiseDescriptorLimit();
  rlimit after{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, before.rlim_max);
  EXPECT_EQ(now, static_cast<uint64_t>(before.rlim_max));
  EXPECT_EQ(after.rlim_max, before.rlim_max) << "the hard limit is kept";
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &before), 0);
}

}  // namespace
}  // namespace ckpt
