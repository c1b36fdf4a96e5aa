// recovery_bench's liveness modes: runs one and prints its figures (one
// JSON object with --json), bench/liveness_bench.h.
#include <cstdio>
#include <string>

#include "bench/liveness_bench.h"

namespace ckpt::bench {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "recovery_bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int RunLivenessMode(const LivenessArgs& args, const std::string& dir,
                    double progress_ns, bool json) {
  if (args.mode == "hang") {
    auto f = MeasureHang(dir, args.timeout_min_s);
    if (!f.ok()) return Fail(std::string(f.status().message()));
    const bool met = f->detect_s <= f->timeout_s + 1;
    std::printf(
        json ? "{\"mode\":\"hang\",\"hang_detect_s\":%.3f,\"hang_timeout_s\":%."
               "3f,"
               "\"hang_silent_s\":%.3f,\"hang_timeout_min_s\":%g,"
               "\"hang_rank_named\":%s,\"hang_stacks_ranks\":%d,"
               "\"hang_node_ranks\":%d,\"hang_resumed\":%s,"
               "\"hang_restore_step\":%llu,\"progress_ns\":%.2f}\n"
             : "hang (SIGSTOP of rank 1): detected %.3f s after the stop, "
               "timeout %.3f s (silent %.3f s by the model; floor %g s)\n"
               "  rank named: %s; stacks of %d of the node's %d trainers; "
               "resumed bit-exact: %s (step %llu); progress beacon %.2f ns\n",
        f->detect_s, f->timeout_s, f->silent_s, f->timeout_min_s,
        f->named ? "true" : "false", f->stacks_ranks, f->node_ranks,
        f->resumed ? "true" : "false",
        static_cast<unsigned long long>(f->restore_step), progress_ns);
    if (!json)
      std::printf("  detect <= timeout + 1 s: %s\n", met ? "met" : "NOT met");
    return 0;
  }
  if (args.mode == "soak") {
    auto f = RunSoak(dir, args.soak);
    if (!f.ok()) return Fail(std::string(f.status().message()));
    std::printf(
        json ? "{\"mode\":\"soak\",\"soak_s\":%g,\"soak_first_step_s\":%g,"
               "\"soak_eval_s\":%g,\"false_hangs\":%d,\"soak_failures\":%d,"
               "\"soak_stragglers\":%d,\"soak_steps\":%lld,\"soak_evals\":%d,"
               "\"progress_ns\":%.2f}\n"
             : "soak %g s (first step %g s, evaluation %g s every 50 steps, "
               "coordinator defaults): %d false hang(s), %d failure(s), "
               "%d straggler(s), %lld steps, %d evaluations; progress beacon "
               "%.2f ns\n",
        f->seconds, f->first_step_s, f->eval_s, f->false_hangs, f->failures,
        f->stragglers, static_cast<long long>(f->steps), f->evals, progress_ns);
    return 0;
  }
  if (args.mode == "straggler") {
    auto f = MeasureStraggler(dir, args.slow_factor);
    if (!f.ok()) return Fail(std::string(f.status().message()));
    std::printf(
        json ? "{\"mode\":\"straggler\",\"straggler_factor\":%g,"
               "\"straggler_window_s\":%g,\"straggler_rank\":%u,"
               "\"straggler_named\":%s,\"straggler_detect_s\":%.3f,"
               "\"straggler_windows_to_detect\":%.2f,\"other_stragglers\":%d,"
               "\"progress_ns\":%.2f}\n"
             : "straggler (rank slowed %gx, %g s windows): rank %u named: %s, "
               "%.3f s after its first step = %.2f windows (target <= 3, the "
               "first one partial); other ranks named: %d; progress beacon "
               "%.2f ns\n",
        f->factor, f->window_s, f->rank, f->named ? "true" : "false",
        f->detect_s, f->windows_to_detect, f->other_stragglers, progress_ns);
    return 0;
  }
  return Fail("unknown mode " + args.mode);
}

}  // namespace ckpt::bench
