// The simulation behind coord_scale_bench (see coord_scale_bench.cc): its
// settings, its figures, one run against a fresh ckpt-coordinator process,
// and their presentation (coord_scale_report.cc).
//
// The simulated nodes live in --processes child processes of the bench
// (its own binary in --child mode, RunChild), each holding a contiguous
// share of the nodes; the parent (RunOnce) starts the coordinator and the
// children, registers the job, drives the steps and merges what the
// children measured. The parent and its children talk over pipes, one line
// per command or figure; their clocks are the machine's steady clock.
// RunOnce is not reentrant (one run at a time).
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
  // Heartbeats only (no step) for this long before the steps: the
  // coordinator's CPU per heartbeat, apart from reports.
  double quiet_s = 0;
  int heartbeat_ms = 600;
  int timeout_ms = 3000;
  int persist_ms = 300;  // STAGED -> DURABLE on each node
  int channels = 16;     // gRPC channels the simulated nodes share, in all
  int processes = 1;     // simulator processes the nodes are split over
  // The coordinator's --heartbeat-interval-nodes (for the 16,384 model;
  // the coordinator's default).
  int interval_nodes = 2048;
  int model_nodes = 16384;  // the model's cluster size
  // Relays (0: none, every node calls the coordinator itself): nodes
  // grouped this many per relay, which gathers their heartbeats and report
  // calls for relay_gather_ms and sends them in one RelayBatch on its own
  // connection; registration stays direct.
  int relay_nodes = 0;
  int relay_gather_ms = 5;
  bool json = false;
  std::vector<int> sweep;
  std::string binary = COORDINATOR_BINARY;
  // --child: simulate nodes [first, first + count) of `nodes` (+1 spare,
  // index `nodes`) against 127.0.0.1:port; commands on stdin.
  bool child = false;
  int port = 0, first = 0, count = 0;
};

struct Result {
  int nodes = 0, ranks = 0, processes = 1;
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
  // The simulator's own lateness: how long after its due time (the
  // node's schedule, or the answer to its previous heartbeat if that came
  // later) each heartbeat was sent, over the whole run. A starved
  // simulator's nodes are silent for the coordinator whatever it does.
  uint64_t sim_late_sends = 0;  // more than timeout/2 late
  double sim_late_p99_s = -1, sim_late_max_s = 0;
  uint64_t sim_heartbeats = 0;  // heartbeats sent, whole run
  double sim_cpu_cores = 0;     // the simulator processes, measured window
  int reregistrations = 0;      // after a false death (a fence)
  // Relays (Args::relay_nodes; 0: none): RelayBatch calls sent, the node
  // heartbeats and report calls they carried, and batches refused whole
  // (RESOURCE_EXHAUSTED, ...), over the whole run.
  int relay_nodes = 0, relay_gather_ms = 0;
  uint64_t relay_batches = 0, relay_heartbeats = 0, relay_reports = 0,
           relay_refused = 0;
  double registration_s = -1;  // first RegisterNode sent -> all answered
  double cpu_total_s = 0;      // coordinator CPU seconds, whole run
  double wall_total_s = 0;
  uint64_t report_errors = 0;
  double cpu_cores = 0;
  // The coordinator's CPU per call: per heartbeat over the quiet window
  // (heartbeats only; -1 without one), per ReportShards call over the
  // steps (what the heartbeats there did not cost, at that rate), and the
  // model at model_nodes (heartbeats at the interval rule, two report
  // calls per node per step): cores.
  double quiet_s = 0, quiet_heartbeats_per_s = 0;
  double cpu_us_per_heartbeat = -1, cpu_us_per_report = -1;
  double report_calls_per_s = 0;
  int model_nodes = 0, model_interval_ms = 0;
  double model_cores = -1;
  uint64_t rss = 0, rss_peak = 0;
  double load_before = 0, load_after = 0, bench_cpu_cores = 0;
  int cpus = 0;
};

// False (with a message on stderr) if the coordinator does not start or
// the nodes cannot be registered.
bool RunOnce(const Args& a, Result* r);
// The --child mode: exit status.
int RunChild(const Args& a);
std::string ToJson(const Result& r);
void PrintText(const Result& r);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_COORD_SCALE_SIM_H_
