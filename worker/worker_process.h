// Test helper: ckpt-worker as a real child process. Start forks and execs it
// with the given flags (over the small test model's defaults) and exactly the
// given CKPT_*/rank variables (none inherited from the test's environment);
// a reader thread collects stdout+stderr, and can SIGKILL the child as soon
// as it prints a line starting with a given prefix. Several may run at once
// (the ranks of one job). Not part of the library.
#ifndef CKPT_WORKER_WORKER_PROCESS_H_
#define CKPT_WORKER_WORKER_PROCESS_H_

#include <sys/types.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ckpt::worker::testing {

struct WorkerRun {
  int status = -1;  // as from waitpid
  std::string output;
  bool exited_ok() const;
  int exit_code() const;  // -1 unless it exited
  bool killed() const;    // by SIGKILL
  // The 16 hex digits after the last "params_digest=", or "".
  std::string Digest() const;
  // The loss printed for `step`, or nullopt.
  std::optional<float> LossAt(int64_t step) const;
};

class WorkerProcess {
 public:
  // flags: "--flag", "value" pairs that override the small model's
  // defaults ("--flag", "": a flag that takes no value).
  static std::unique_ptr<WorkerProcess> Start(
      const std::vector<std::string>& flags,
      const std::map<std::string, std::string>& env,
      std::optional<std::string> kill_on_line = {});
  ~WorkerProcess();  // SIGKILLs the child if still running
  pid_t pid() const { return pid_; }
  WorkerRun Wait();

  // Blocks until the output, past the end of the previous match, holds a
  // line starting with `prefix`; returns that line (without its newline).
  // nullopt when the output ends first (the child exited).
  std::optional<std::string> WaitForLine(const std::string& prefix);
  // The output so far.
  std::string Output();

 private:
  WorkerProcess() = default;
  pid_t pid_ = -1;
  std::thread reader_;
  WorkerRun run_;
  std::mutex mu_;  // run_.output, eof_, seen_ while the reader runs
  std::condition_variable cv_;
  bool eof_ = false;
  size_t seen_ = 0;  // output before this offset is matched already
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort();

}  // namespace ckpt::worker::testing

#endif  // CKPT_WORKER_WORKER_PROCESS_H_
