// Stack capture: the evidence ckptrun keeps of a hung trainer before it
// stops it. For every process of the trainer's process group (a wrapper
// and the real trainer under it): the Python frames of each thread, from
// the faulthandler dump that ckpt.torch registers on SIGUSR2 (only a
// process that catches SIGUSR2 is sent one, so a C++ trainer is never
// killed by it; the dump goes to the file named by $CKPT_STACKS_FILE),
// then the native stacks of every thread through `eu-stack` (elfutils) or
// else `gdb -batch` (Debian packages), which also work on a process
// stopped with SIGSTOP. Each tool runs bounded in time and output.
//
// Thread-safety: CaptureStacks may run concurrently for different groups;
// it forks, and between fork and exec calls only async-signal-safe
// functions.
#ifndef CKPT_TOOLS_STACK_CAPTURE_H_
#define CKPT_TOOLS_STACK_CAPTURE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::tools {

struct CapturedStacks {
  uint32_t rank = 0;
  pid_t pid = 0;     // the trainer (its process group)
  std::string tool;  // the tools that gave output, e.g. "faulthandler+gdb"
  std::string text;  // at most max_bytes
};

struct CaptureOptions {
  std::chrono::milliseconds timeout{20000};  // per native tool run
  std::chrono::milliseconds python_wait{1000};
  size_t max_bytes = 256 << 10;
  std::string py_file;  // the trainer's $CKPT_STACKS_FILE ("" none)
};

// The pids of process group `pgid`, the leader first.
std::vector<pid_t> ProcessGroup(pid_t pgid);
// Whether `pid` has a handler installed for `sig` (/proc/PID/status).
bool CatchesSignal(pid_t pid, int sig);

CapturedStacks CaptureStacks(uint32_t rank, pid_t pgid,
                             const CaptureOptions& options);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_STACK_CAPTURE_H_
