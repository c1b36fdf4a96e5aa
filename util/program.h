// The start of every binary's main() (ckptd, ckpt-coordinator, ckpt-relay,
// ckptctl, ckptrun): the --version flag, the signals a main thread waits
// for, and the descriptor limit of a server. Functions only.
#ifndef CKPT_UTIL_PROGRAM_H_
#define CKPT_UTIL_PROGRAM_H_

#include <signal.h>

#include <cstdint>
#include <initializer_list>

namespace ckpt {

// True, after printing "<program> <version>" on stdout, when an argument
// before any "--" (what follows is another program's) is "--version".
bool PrintedVersion(int argc, char** argv, const char* program,
                    const char* version);
// The same for "--help" or "-h": prints `usage` on stdout. For the programs
// that parse their arguments by hand (CLI11's answer --help themselves).
bool PrintedHelp(int argc, char** argv, const char* usage);

// Blocks `signals` in the calling thread, and so in every thread it starts
// afterwards, and returns them as a set for sigwait/sigtimedwait. Call it
// before anything can start a thread (gRPC does while the options are
// parsed): a signal then goes only to the thread that waits for it.
sigset_t BlockSignals(std::initializer_list<int> signals);

// Raises the soft limit on open descriptors to the hard one and returns
// the soft limit in force after. Every connection (a node's, a relay's,
// a client's) and every open shard costs a descriptor, and systemd's
// default soft limit is 1024 (hard 524288): a coordinator with more
// nodes calling it directly would refuse connections. Safe: gRPC and
// ours use epoll and io_uring, never select(). Best effort: a refusal
// leaves the old limit.
uint64_t RaiseDescriptorLimit();

}  // namespace ckpt

#endif  // CKPT_UTIL_PROGRAM_H_
