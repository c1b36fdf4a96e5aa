// coord_scale_bench: the real ckpt-coordinator binary against N simulated
// nodes in --processes simulator processes (children of this binary in
// --child mode; real gRPC over loopback, callback stubs on a few channels
// per process, no training). Each node hosts --ranks-per-node
// ranks, heartbeats every --heartbeat-ms, and every --interval-s sends one
// ReportShards call with all its ranks STAGED, then (after --persist-ms)
// one with all DURABLE, retrying RESOURCE_EXHAUSTED/UNAVAILABLE with
// backoff. A spare node waits. At --kill-at-s one node stops (no more
// heartbeats or reports) to measure detection and the plan.
//
//   coord_scale_bench --nodes N [--ranks-per-node 8] [--interval-s S]
//                     [--duration-s D] [--processes P] [--quiet-s Q]
//                     [--json] [--sweep 256,1024,2048]
//
// Figures: commit latency (last node's DURABLE call sent -> the reply that
// says the step is committed, i.e. manifest written and last good durable)
// p50/p99; detection (the dead node's last heartbeat -> FAILURE_DETECTED,
// both on CLOCK_MONOTONIC); plan (FAILURE_DETECTED -> the new generation
// seen on a WatchJob stream, i.e. durable and pushed); plan size (orders);
// report throughput; the coordinator process's CPU (cores, averaged over
// the measured period) and RSS; the machine's load average; the
// simulators' own lateness (each heartbeat's send against its schedule,
// p99 and max) and CPU; with --quiet-s, the coordinator's CPU per
// heartbeat (a window of heartbeats only) and per report call, and the
// cores they would take at --model-nodes (16,384). With --relay-nodes K
// the nodes' heartbeats and report calls go through relays of K nodes
// each (one connection per relay, one RelayBatch per --relay-gather-ms,
// default 5), each node still sending its own messages; the figures per
// heartbeat and per report call are then per relayed item, and the
// RelayBatch calls are counted beside them.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "bench/coord_scale_sim.h"
#include "util/program.h"

using ckpt::bench::Args;
using ckpt::bench::PrintText;
using ckpt::bench::Result;
using ckpt::bench::RunOnce;
using ckpt::bench::ToJson;

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "coord_scale_bench", CKPT_VERSION))
    return 0;
  if (ckpt::PrintedHelp(
          argc, argv,
          "usage: coord_scale_bench --nodes N [--ranks-per-node 8] "
          "[--interval-s S] [--duration-s D] [--kill-at-s S] [--heartbeat-ms "
          "MS] [--timeout-ms MS] [--persist-ms MS] [--channels C] "
          "[--processes P] [--quiet-s S] [--interval-nodes B] "
          "[--model-nodes N] [--relay-nodes K] [--relay-gather-ms MS] "
          "[--coordinator-binary PATH] [--json] "
          "[--sweep 256,1024,2048]"))
    return 0;
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "coord_scale_bench: %s: missing value\n",
                     f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (f == "--nodes")
        a.nodes = std::stoi(next());
      else if (f == "--ranks-per-node")
        a.ranks_per_node = std::stoi(next());
      else if (f == "--interval-s")
        a.interval_s = std::stod(next());
      else if (f == "--duration-s")
        a.duration_s = std::stod(next());
      else if (f == "--kill-at-s")
        a.kill_at_s = std::stod(next());
      else if (f == "--heartbeat-ms")
        a.heartbeat_ms = std::stoi(next());
      else if (f == "--timeout-ms")
        a.timeout_ms = std::stoi(next());
      else if (f == "--persist-ms")
        a.persist_ms = std::stoi(next());
      else if (f == "--channels")
        a.channels = std::stoi(next());
      else if (f == "--processes")
        a.processes = std::stoi(next());
      else if (f == "--quiet-s")
        a.quiet_s = std::stod(next());
      else if (f == "--interval-nodes")
        a.interval_nodes = std::stoi(next());
      else if (f == "--relay-nodes")
        a.relay_nodes = std::stoi(next());
      else if (f == "--relay-gather-ms")
        a.relay_gather_ms = std::stoi(next());
      else if (f == "--model-nodes")
        a.model_nodes = std::stoi(next());
      else if (f == "--child")
        a.child = true;
      else if (f == "--port")
        a.port = std::stoi(next());
      else if (f == "--first")
        a.first = std::stoi(next());
      else if (f == "--count")
        a.count = std::stoi(next());
      else if (f == "--coordinator-binary")
        a.binary = next();
      else if (f == "--json")
        a.json = true;
      else if (f == "--sweep") {
        std::stringstream in(next());
        std::string n;
        while (std::getline(in, n, ',')) a.sweep.push_back(std::stoi(n));
      } else {
        std::fprintf(stderr, "coord_scale_bench: unknown flag %s\n", f.c_str());
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "coord_scale_bench: %s: not a number\n", f.c_str());
      return 2;
    }
  }
  if (a.nodes < 2 || a.nodes > 100000)
    return std::fprintf(stderr, "--nodes: must be in [2, 100000]\n"), 2;
  if (a.ranks_per_node < 1 || a.ranks_per_node > 64)
    return std::fprintf(stderr, "--ranks-per-node: must be in [1, 64]\n"), 2;
  if (a.interval_s <= 0 || a.duration_s <= 0 || a.heartbeat_ms < 10 ||
      a.timeout_ms < 100 || a.channels < 1)
    return std::fprintf(stderr,
                        "--interval-s/--duration-s/--heartbeat-ms/--timeout-ms/"
                        "--channels: bad value\n"),
           2;
  if (a.processes < 1 || a.processes > 256)
    return std::fprintf(stderr, "--processes: must be in [1, 256]\n"), 2;
  if (a.quiet_s < 0 || a.interval_nodes < 0 || a.model_nodes < 1)
    return std::fprintf(
               stderr, "--quiet-s/--interval-nodes/--model-nodes: bad value\n"),
           2;
  if (a.relay_nodes < 0 || a.relay_nodes > 4096)
    return std::fprintf(stderr, "--relay-nodes: must be in [0, 4096]\n"), 2;
  if (a.relay_gather_ms < 0 || a.relay_gather_ms > 1000)
    return std::fprintf(stderr, "--relay-gather-ms: must be in [0, 1000]\n"), 2;
  if (a.child) {
    if (a.port <= 0 || a.port > 65535 || a.first < 0 || a.count < 1 ||
        a.first + a.count > a.nodes + 1)
      return std::fprintf(stderr,
                          "--child: --port/--first/--count: bad value\n"),
             2;
    return ckpt::bench::RunChild(a);
  }
  if (a.kill_at_s < 0) a.kill_at_s = a.duration_s * 0.4;
  std::vector<int> sizes =
      a.sweep.empty() ? std::vector<int>{a.nodes} : a.sweep;
  std::vector<Result> results;
  for (int n : sizes) {
    Args one = a;
    one.nodes = n;
    Result r;
    if (!RunOnce(one, &r)) return 1;
    results.push_back(r);
    if (!a.json) PrintText(r);
  }
  if (a.json) {
    if (results.size() == 1) {
      std::printf("%s\n", ToJson(results[0]).c_str());
    } else {
      std::printf("{\"runs\": [");
      for (size_t i = 0; i < results.size(); ++i)
        std::printf("%s%s", i ? ", " : "", ToJson(results[i]).c_str());
      std::printf("]}\n");
    }
  }
  return 0;
}
