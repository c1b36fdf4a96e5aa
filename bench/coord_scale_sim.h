// The simulation behind coord_scale_bench (see coord_scale_bench.cc): its
// settings, its figures, one run against a fresh ckpt-coordinator process,
// and their presentation (coord_scale_report.cc). RunOnce is not reentrant
// (one run at a time).
#ifndef CKPT_BENCH_COORD_SCALE_SIM_H_
#define CKPT_BENCH_COORD_SCALE_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt::bench {

struct Args {
  int nodes = 256;
  int ranks_per_node = 8;
  double interval_s = 5;
  double duration_s = 30;
  double kill_at_s = -1;  // default: 40% of the duration
  int heartbeat_ms = 600;
  int timeout_ms = 3000;
  int persist_ms = 300;  // STAGED -> DURABLE on each node
  int channels = 16;     // gRPC channels the simulated nodes share
  bool json = false;
  std::vector<int> sweep;
  std::string binary = COORDINATOR_BINARY;
};

struct Result {
  int nodes = 0, ranks = 0;
  double interval_s = 0, duration_s = 0;
  double commit_p50 = -1, commit_p99 = -1, commit_max = -1;
  int steps_committed = 0, steps_started = 0;
  double detect_s = -1, plan_s = -1, plan_compute_s = -1;
  int plan_orders = 0;
  int false_deaths = 0;
  double hb_p99 = -1, hb_max = -1;  // heartbeat round trip
  uint64_t hb_errors = 0;
  double reports_per_s = 0, rpcs_per_s = 0;
  // Heartbeats answered OK per second over the measured window, and the
  // largest interval the coordinator told a node (0: none told).
  double heartbeats_per_s = 0;
  int told_heartbeat_ms = 0;
  uint64_t refused = 0;  // RESOURCE_EXHAUSTED/UNAVAILABLE answers, retried
  // Refused (RESOURCE_EXHAUSTED/UNAVAILABLE), by kind, over the whole run
  // (registration included); reports: `refused` above is the same count.
  uint64_t refused_register = 0, refused_heartbeat = 0, refused_job = 0;
  uint64_t hb_timed_out = 0;  // DEADLINE_EXCEEDED/UNAVAILABLE heartbeats
  // Heartbeats the simulator itself sent late (more than timeout/2): a
  // starved simulator, not the coordinator.
  uint64_t sim_late_sends = 0;
  double sim_late_max_s = 0;
  int reregistrations = 0;     // after a false death (a fence)
  double registration_s = -1;  // first RegisterNode sent -> all answered
  double cpu_total_s = 0;      // coordinator CPU seconds, whole run
  double wall_total_s = 0;
  uint64_t report_errors = 0;
  double cpu_cores = 0;
  uint64_t rss = 0, rss_peak = 0;
  double load_before = 0, load_after = 0, bench_cpu_cores = 0;
  int cpus = 0;
};

// False (with a message on stderr) if the coordinator does not start.
bool RunOnce(const Args& a, Result* r);
std::string ToJson(const Result& r);
void PrintText(const Result& r);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_COORD_SCALE_SIM_H_
