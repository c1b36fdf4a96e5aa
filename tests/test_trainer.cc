// A small deterministic trainer for fault tests: connects through the
// environment or flags and saves a state of the given size at steps
// FIRST_STEP, FIRST_STEP+1, ... until killed or the step limit is reached.
// Usage: test_trainer SOCKET JOB BYTES FIRST_STEP LAST_STEP [COPY_THREADS]
// With TEST_TRAINER_UID=N it first becomes uid and gid N; with
// TEST_TRAINER_RESTORE=STEP it then restores STEP and exits 4 if that fails,
// 5 if the bytes differ from the saved state. With TEST_TRAINER_RESUME=STEP
// it restores STEP before its first save (a restarted trainer resuming;
// exit 4 if that fails).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/harness.h"

int main(int argc, char** argv) {
  if (argc < 6) return 100;
  if (const char* uid = std::getenv("TEST_TRAINER_UID")) {
    const int id = std::atoi(uid);
    if (setgid(id) != 0 || setuid(id) != 0) return 101;
  }
  ckpt::ClientOptions o;
  o.socket_path = argv[1];
  o.job = argv[2];
  o.rank = 0;
  o.world_size = 1;
  if (argc > 6) o.copy_threads = std::atoi(argv[6]);
  auto c = ckpt::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "test_trainer: %s\n",
                 std::string(c.status().message()).c_str());
    return 2;
  }
  auto state =
      ckpt::testing::MakeState(std::strtoull(argv[3], nullptr, 10), 8, 2);
  int first = std::atoi(argv[4]), last = std::atoi(argv[5]);
  if (const char* resume = std::getenv("TEST_TRAINER_RESUME")) {
    auto got = state.EmptyLike();
    absl::Status s = (*c)->Restore(std::atoll(resume), got.tensors);
    if (!s.ok()) {
      std::fprintf(stderr, "test_trainer: resume: %s\n",
                   std::string(s.message()).c_str());
      return 4;
    }
  }
  for (int step = first; step <= last; ++step) {
    absl::Status s = (*c)->Save(step, state.tensors);
    if (!s.ok()) {
      std::fprintf(stderr, "test_trainer: step %d: %s\n", step,
                   std::string(s.message()).c_str());
      return 3;
    }
  }
  if (const char* restore = std::getenv("TEST_TRAINER_RESTORE")) {
    auto got = state.EmptyLike();
    absl::Status s = (*c)->Restore(std::atoll(restore), got.tensors);
    if (!s.ok()) {
      std::fprintf(stderr, "test_trainer: restore: %s\n",
                   std::string(s.message()).c_str());
      return 4;
    }
    if (!got.Equals(state)) return 5;
  }
  return 0;
}
