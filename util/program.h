// The start of every binary's main() (ckptd, ckpt-coordinator, ckptctl,
// ckptrun): the --version flag and the signals a main thread waits for.
// Functions only.
#ifndef CKPT_UTIL_PROGRAM_H_
#define CKPT_UTIL_PROGRAM_H_

#include <signal.h>

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

}  // namespace ckpt

#endif  // CKPT_UTIL_PROGRAM_H_
