// Phase stamps of ckpt-worker, for taking an in-process restart apart:
// with $CKPT_WORKER_PHASES set, each call writes "phase <what> rank=<r>
// mono_us=<CLOCK_MONOTONIC us>" to stderr (ckptrun logs it with the
// trainer's output; rank -1: the restart monitor's thread). Off (one
// getenv, once) otherwise. worker/README.md lists the phases.
#ifndef CKPT_WORKER_PHASE_TRACE_H_
#define CKPT_WORKER_PHASE_TRACE_H_

#include <time.h>

#include <cstdio>
#include <cstdlib>

namespace ckpt::worker {

inline void Phase(const char* what, int rank) {
  static const bool on = std::getenv("CKPT_WORKER_PHASES") != nullptr;
  if (!on) return;
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  std::fprintf(stderr, "phase %s rank=%d mono_us=%lld\n", what, rank,
               static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000);
}
}  // namespace ckpt::worker

#endif  // CKPT_WORKER_PHASE_TRACE_H_
