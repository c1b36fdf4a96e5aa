// Who owns a job's shared memory, with real processes: trainers run as
// uid 1000 (test_trainer drops to it), the daemon is root.
// - systemd-logind's RemoveIPC (the default for uids >= 1000) deletes every
//   /dev/shm file a user owns when the user's last session ends; the job
//   must go on saving and restoring after that.
// - A segment another local user put under an arena's name is never used
//   by a restarted daemon, nor handed to the job.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/daemon_test.h"

namespace ckpt::testing {
namespace {

constexpr uid_t kTrainerUid = 1000;
constexpr uint64_t kBytes = 8 << 20;

// Runs test_trainer as kTrainerUid: saves steps [first, last], then restores
// `restore` unless negative. Returns its exit status, -1 if it did not exit.
int RunTrainer(const std::string& socket, const std::string& job, int first,
               int last, int restore) {
  std::string uid = "TEST_TRAINER_UID=" + std::to_string(kTrainerUid);
  std::string step = "TEST_TRAINER_RESTORE=" + std::to_string(restore);
  char* envp[] = {uid.data(), restore >= 0 ? step.data() : nullptr, nullptr};
  const std::string b = std::to_string(kBytes), f = std::to_string(first),
                    l = std::to_string(last);
  pid_t child = fork();
  if (child == 0) {
    execle(TEST_TRAINER_BINARY, TEST_TRAINER_BINARY, socket.c_str(),
           job.c_str(), b.c_str(), f.c_str(), l.c_str(), nullptr, envp);
    _exit(127);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

// The /dev/shm names (without "/dev/shm/") that start with prefix and are
// owned by uid.
std::vector<std::string> SegmentsOf(const std::string& prefix, uid_t uid) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    struct stat st {};
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0 &&
        stat((std::string("/dev/shm/") + e->d_name).c_str(), &st) == 0 &&
        st.st_uid == uid)
      out.push_back(e->d_name);
  }
  closedir(dir);
  return out;
}

class ArenaOwnerTest : public DaemonTest {
 protected:
  void SetUp() override {
    if (geteuid() != 0)
      GTEST_SKIP() << "needs root to run trainers as uid " << kTrainerUid;
    DaemonTest::SetUp();
  }
};

TEST_F(ArenaOwnerTest, JobGoesOnAfterLogindRemovesTheUsersSharedMemory) {
  ASSERT_EQ(RunTrainer(daemon_->socket(), "tenant", 1, 2, -1), 0);
  // The user logs out: logind unlinks every /dev/shm file the uid owns (here
  // only this test's, other tests share /dev/shm).
  for (const std::string& name : SegmentsOf(prefix_, kTrainerUid))
    ASSERT_EQ(shm_unlink(("/" + name).c_str()), 0) << name;
  // A new session: the trainer saves again and restores from memory.
  EXPECT_EQ(RunTrainer(daemon_->socket(), "tenant", 3, 3, 2), 0)
      << "exit 2: it could not attach its arena; 3: save failed; 4: restore "
         "failed";
}

TEST_F(ArenaOwnerTest, RestartedDaemonNeverUsesASegmentAnotherUserPutInPlace) {
  ASSERT_EQ(RunTrainer(daemon_->socket(), "tenant", 1, 1, -1), 0);
  auto client = Connect("tenant");  // root may wait for the job's durability
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->WaitDurable(1).ok());
  client.reset();
  daemon_->Kill(SIGKILL);
  daemon_->Wait();
  // Another local user (uid 4321) owns a segment under the arena's name
  // with a valid header: here the real one, given away.
  const std::string arena = "/dev/shm/" + prefix_ + ".tenant.r0";
  ASSERT_EQ(chown(arena.c_str(), 4321, 4321), 0);
  Restart();
  EXPECT_EQ(RunTrainer(daemon_->socket(), "tenant", 2, 2, 1), 0)
      << "exit 2: it could not attach its arena; 3: save failed; 4: restore "
         "failed";
  struct stat st {};
  ASSERT_EQ(stat(arena.c_str(), &st), 0);
  EXPECT_NE(st.st_uid, 4321u)
      << "the job's saves went to another user's segment";
}

}  // namespace
}  // namespace ckpt::testing
