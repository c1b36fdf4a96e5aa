// recovery_bench: recovery times of a multi-node job on one machine, with
// the limits they are held to measured in the same run.
//   recovery_bench [--bytes-per-rank N] [--replicas] [--dir DIR] [--json]
//   recovery_bench --hang [--hang-timeout-min-s S] | --soak [--soak-s S]
//                  | --straggler [--slow-factor F]   [--dir DIR] [--json]
// Two nodes x two ranks (cluster_trainer, N bytes each, default 1 GiB) and
// a spare, run by ckpt-coordinator, ckptd and ckptrun (tests/
// cluster_harness.h). Then:
//  1. node loss: node b is SIGKILLed with its trainers and its shared
//     memory; the spare takes ranks 2,3. Breakdown from the coordinator's
//     events and the trainers' logs (one monotonic clock): detection
//     (kill -> FAILURE_DETECTED), plan (-> PLAN_MADE), prefetch into the
//     spare's memory (-> PLAN_ACKED), trainer restart (-> trainer start)
//     and restore (-> last rank restored). Limit: a raw sequential O_DIRECT
//     read of the lost ranks' shards from the shared root.
//     Target: detected -> all restored <= 1.5 x the raw read.
//  2. trainer crash: rank 0's trainer is SIGKILLed, its node lives. Limit:
//     a memcpy of the rank's state into memory already faulted in.
//     Target: rank 0's restore call <= 1.2 x the memcpy (process start is
//     reported beside it).
// With --replicas (issue 19) every node has a failure domain and a replica
// listener: the lost ranks come from a live peer's memory (event
// RESTORE_SOURCES says which copy), and a second limit is measured in the
// same run: the lost bytes sent over one plain loopback TCP connection.
// With --object-url s3://BUCKET/PREFIX (AWS_* environment) the nodes share
// no directory: --shared-root is that URL (doc/object-tier.md), the spare
// prefetches from the object store, and the limit of 1. is a raw parallel
// GET of the lost shards (bench/object_raw.h, same part size and
// concurrency as the daemon's).
// The liveness modes (bench/liveness_bench.h, doc/benchmarks.md) run
// instead: --hang (a SIGSTOPped trainer: detection against the model's
// timeout), --soak (ckpt-worker under the defaults for --soak-s seconds,
// default 600: false hangs) and --straggler (a rank slowed --slow-factor
// times, default 3: windows until it is named).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "bench/liveness_bench.h"
#include "bench/object_raw.h"
#include "bench/progress_cost.h"
#include "bench/raw_io.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "tests/cluster_harness.h"
#include "tests/harness.h"
#include "tests/test_util.h"

namespace {

namespace cv1 = ::ckpt::coord::v1;
using ckpt::testing::Cluster;
using ckpt::testing::ClusterOptions;
using std::chrono::milliseconds;
using std::chrono::seconds;

long long MonoMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "recovery_bench: %s\n", what.c_str());
  return 1;
}

std::string EventLog(const Cluster& c) {
  std::string out = "coordinator events:\n";
  for (const auto& e : c.Events())
    out += std::to_string(e.time_ms()) + " " + cv1::EventKind_Name(e.kind()) +
           " " + e.node_id() + " " + e.detail() + "\n";
  return out;
}

// The first event of `kind` at or after `from_ms` (and for `node` if given).
std::optional<cv1::Event> FirstEvent(const std::vector<cv1::Event>& events,
                                     cv1::EventKind kind, long long from_ms,
                                     const std::string& node = "") {
  for (const auto& e : events)
    if (e.kind() == kind && e.time_ms() >= from_ms &&
        (node.empty() || e.node_id() == node))
      return e;
  return std::nullopt;
}

struct Restart {
  long long start_ms = 0;
  long long restored_ms = 0;
  double restore_s = 0;
  double process_s = 0;
  uint64_t step = 0;
};

// Rank's first trainer start after `after_ms` and its restore.
std::optional<Restart> RestartAfter(const Cluster& c, uint32_t rank,
                                    long long after_ms) {
  Restart r;
  bool started = false;
  for (const auto& l : c.TrainerLog(rank)) {
    if (l.kind == "start" && !started &&
        std::stoll(l.fields.at("mono_ms")) >= after_ms) {
      started = true;
      r.start_ms = std::stoll(l.fields.at("mono_ms"));
    } else if (l.kind == "restored" && started) {
      r.restored_ms = std::stoll(l.fields.at("mono_ms"));
      r.restore_s = std::stod(l.fields.at("seconds"));
      r.process_s = std::stod(l.fields.at("process_start_to_restored"));
      r.step = std::stoull(l.fields.at("step"));
      return r;
    }
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 1ull << 30;
  std::string dir = "/var/tmp";
  bool json = false, keep = false, replicas = false;
  std::string object_url;
  ckpt::bench::LivenessArgs live;
  auto number = [&](int& i, double lo, double hi, double& out) {
    char* end = nullptr;
    out = std::strtod(argv[++i], &end);
    return *end == '\0' && out >= lo && out <= hi;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--hang" || a == "--soak" || a == "--straggler") {
      if (!live.mode.empty()) return Fail("one of --hang, --soak, --straggler");
      live.mode = a.substr(2);
    } else if (a == "--hang-timeout-min-s" && i + 1 < argc) {
      if (!number(i, 1, 3600, live.timeout_min_s))
        return Fail("--hang-timeout-min-s: a number of seconds in [1, 3600]");
    } else if (a == "--soak-s" && i + 1 < argc) {
      if (!number(i, 10, 86400, live.soak.seconds))
        return Fail("--soak-s: a number of seconds in [10, 86400]");
      live.mode = "soak";
    } else if (a == "--soak-first-step-s" && i + 1 < argc) {
      if (!number(i, 0, 3600, live.soak.first_step_s))
        return Fail("--soak-first-step-s: seconds in [0, 3600]");
    } else if (a == "--soak-eval-s" && i + 1 < argc) {
      if (!number(i, 0.01, 3600, live.soak.eval_s))
        return Fail("--soak-eval-s: seconds in [0.01, 3600]");
    } else if (a == "--slow-factor" && i + 1 < argc) {
      if (!number(i, 1.5, 100, live.slow_factor))
        return Fail("--slow-factor: a factor in [1.5, 100]");
    } else if (a == "--bytes-per-rank" && i + 1 < argc) {
      bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--replicas") {
      replicas = true;
    } else if (a == "--keep") {
      keep = true;
    } else if (a == "--object-url" && i + 1 < argc) {
      object_url = argv[++i];
    } else {
      return Fail(
          "unknown argument " + a.substr(0, 40) +
          " (--bytes-per-rank N, --replicas, --dir DIR, --json, --keep, "
          "--object-url s3://B/P, --hang [--hang-timeout-min-s S], "
          "--soak [--soak-s S --soak-first-step-s S --soak-eval-s S], "
          "--straggler [--slow-factor F])");
    }
  }
  if (bytes < (1 << 20)) return Fail("--bytes-per-rank: at least 1 MiB");
  std::string root = dir + "/recovery-bench-" + std::to_string(getpid());
  std::filesystem::create_directories(root);
  struct Cleanup {
    std::string path;
    bool keep;
    ~Cleanup() {
      if (keep)
        std::fprintf(stderr, "recovery_bench: logs kept in %s\n", path.c_str());
      else
        std::filesystem::remove_all(path);
    }
  } cleanup{root, keep};

  // The beacon's cost first, on a quiet machine.
  auto progress = ckpt::bench::MeasureProgressCost(root, 5'000'000);
  if (!progress.ok())
    return Fail("progress cost: " + std::string(progress.status().message()));
  if (!live.mode.empty())
    return ckpt::bench::RunLivenessMode(live, root, progress->progress_ns,
                                        json);

  ClusterOptions o;
  o.dir = root;
  o.world_size = 4;
  o.bytes_per_rank = bytes;
  // Three steps, then the trainers sit idle: failures hit a quiet job, and
  // the raw read is measured on a quiet machine.
  o.last_step = 3;
  o.hold = true;
  o.step_ms = 200;
  o.heartbeat_timeout_ms = 2000;
  o.ckptd_args = {"--slots", "2"};
  o.shared_root_url = object_url;
  if (replicas) {
    const std::vector<int> ports = ckpt::testing::FreeLoopbackPorts(3);
    int i = 0;
    for (const char* id : {"a", "b", "c"})
      o.node_ckptd_args[id] = {"--domain", std::string("rack-") + id,
                               "--replica-port", std::to_string(ports[i++])};
  }
  Cluster c(o);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  c.StartNode("c", /*spare=*/true);
  auto last_good = [&]() -> uint64_t {
    auto j = c.Job();
    return j && j->has_last_good() ? j->last_good_step() : 0;
  };
  if (!Cluster::WaitUntil([&] { return last_good() >= o.last_step; },
                          seconds(300)))
    return Fail("the job never made its last step durable everywhere\n" +
                c.DumpLogs());

  // 1. Node loss.
  long long kill_ms = MonoMs();
  c.KillNode("b");
  std::optional<Restart> lost[2];
  if (!Cluster::WaitUntil(
          [&] {
            lost[0] = RestartAfter(c, 2, kill_ms);
            lost[1] = RestartAfter(c, 3, kill_ms);
            return lost[0] && lost[1] && RestartAfter(c, 0, kill_ms) &&
                   RestartAfter(c, 1, kill_ms);
          },
          seconds(120)))
    return Fail("ranks did not restore after the node loss\n" + c.DumpLogs() +
                EventLog(c));
  auto events = c.Events();
  auto detected = FirstEvent(events, cv1::FAILURE_DETECTED, kill_ms - 10, "b");
  if (!detected) return Fail("no FAILURE_DETECTED event for node b");
  auto planned = FirstEvent(events, cv1::PLAN_MADE, detected->time_ms());
  auto acked = FirstEvent(events, cv1::PLAN_ACKED, detected->time_ms());
  if (!planned || !acked)
    return Fail("no PLAN_MADE / PLAN_ACKED after the failure");
  long long first_start = INT64_MAX, all_restored = 0;
  uint64_t restore_step = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    auto rs = RestartAfter(c, r, kill_ms);
    first_start = std::min(first_start, rs->start_ms);
    all_restored = std::max(all_restored, rs->restored_ms);
    restore_step = rs->step;
  }
  // The limit: the lost ranks' shards read back sequentially, raw.
  double raw_read_s = 0;
  if (!object_url.empty()) {
    auto so = ckpt::storage::ResolveObjectStoreOptions(object_url, {});
    if (!so.ok()) return Fail(std::string(so.status().message()));
    auto store = ckpt::storage::NewObjectBackend(*so);
    if (!store.ok()) return Fail(std::string(store.status().message()));
    for (uint32_t r : {2u, 3u}) {
      std::string key = ckpt::storage::ShardKey(o.job, restore_step, r, "b");
      auto size = (*store)->ObjectSize(key);
      if (!size.ok()) return Fail(std::string(size.status().message()));
      std::vector<char> buf(*size, 1);
      auto t = ckpt::bench::RawObjectGet(*so, key, buf.data(), buf.size());
      if (!t.ok()) return Fail(std::string(t.status().message()));
      raw_read_s += *t;
    }
  }
  std::vector<std::string> lost_files;
  uint64_t lost_bytes = 0;
  // Node b wrote them (cluster mode names the node in the key).
  ckpt::storage::LocalBackendOptions shared_opts;
  shared_opts.root = object_url.empty() ? c.shared_root() : root + "/unused";
  shared_opts.remove_tmp_files = false;  // only paths are looked up
  auto shared = ckpt::storage::NewLocalBackend(shared_opts);
  if (!shared.ok()) return Fail(std::string(shared.status().message()));
  for (uint32_t r : {2u, 3u}) {
    if (!object_url.empty()) break;  // measured above
    std::string path = *(*shared)->LocalPath(
        ckpt::storage::ShardKey(o.job, restore_step, r, "b"));
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return Fail(path + ": " + ec.message());
    lost_files.push_back(path);
    lost_bytes = std::max<uint64_t>(lost_bytes, size);
  }
  lost_bytes &= ~uint64_t{4095};
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, std::max<uint64_t>(lost_bytes, 4096)) != 0)
    return Fail("out of memory");
  std::memset(buf, 0, lost_bytes);  // faulted in: the read alone is timed
  for (const auto& f : lost_files) {
    // A cache that cannot be dropped only makes the raw read (the limit)
    // faster.
    (void)ckpt::bench::DropFileCache(f);
    auto t = ckpt::bench::RawRead(f, static_cast<char*>(buf), lost_bytes, {});
    if (!t.ok()) return Fail(std::string(t.status().message()));
    raw_read_s += *t;
  }
  // The network's limit (--replicas): the same bytes over plain TCP.
  double raw_tcp_s = 0;
  std::string restore_from;
  if (replicas) {
    std::vector<char> sink(std::max<uint64_t>(lost_bytes, 1));
    for (int i = 0; i < 2; ++i) {
      auto t = ckpt::bench::RawTcpTransfer(static_cast<char*>(buf), lost_bytes,
                                           sink.data());
      if (!t.ok()) return Fail(std::string(t.status().message()));
      raw_tcp_s += *t;
    }
    if (auto where =
            FirstEvent(events, cv1::RESTORE_SOURCES, detected->time_ms()))
      for (const auto& r : where->restore().ranks())
        restore_from = restore_from.empty() || restore_from == r.copy()
                           ? r.copy()
                           : "mixed";
  }
  free(buf);

  // 2. Trainer crash on a live node, once the job is quiet again.
  auto all_done = [&] {
    for (uint32_t r = 0; r < 4; ++r) {
      auto log = c.TrainerLog(r);
      if (log.empty() || log.back().kind != "done") return false;
    }
    return true;
  };
  if (!Cluster::WaitUntil(all_done, seconds(120)))
    return Fail("ranks did not finish after the recovery\n" + c.DumpLogs());
  std::this_thread::sleep_for(seconds(2));  // persists and heartbeats settle
  long long crash_ms = MonoMs();
  pid_t victim = c.TrainerPid(0);
  if (victim <= 0 || kill(victim, SIGKILL) != 0)
    return Fail("cannot kill rank 0's trainer");
  std::optional<Restart> crash;
  if (!Cluster::WaitUntil(
          [&] { return (crash = RestartAfter(c, 0, crash_ms)).has_value(); },
          seconds(120)))
    return Fail("rank 0 did not restore after its crash\n" + c.DumpLogs());
  auto state = ckpt::testing::MakeState(bytes, 8, 1);
  std::vector<char> dst(state.bytes());
  std::memset(dst.data(), 1, dst.size());
  double memcpy_s = 1e9;
  for (int i = 0; i < 3; ++i)
    memcpy_s = std::min(
        memcpy_s, ckpt::bench::ParallelMemcpy(dst.data(), state.tensors, 2));
  // Every rank restarts after a crash (they roll back together), and on
  // this one machine the four share its cores: the limit for that is four
  // rank-sized memcpys at once.
  double memcpy_all_s = 0;
  {
    std::vector<std::vector<char>> dsts(4, std::vector<char>(state.bytes(), 1));
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> copiers;
    for (auto& d : dsts)
      copiers.emplace_back([&, p = d.data()] {
        ckpt::bench::ParallelMemcpy(p, state.tensors, 2);
      });
    for (auto& t : copiers) t.join();
    memcpy_all_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  double slowest_crash_restore_s = 0;
  for (uint32_t r = 0; r < 4; ++r)
    if (auto rs = RestartAfter(c, r, crash_ms))
      slowest_crash_restore_s =
          std::max(slowest_crash_restore_s, rs->restore_s);

  const double detect_s = (detected->time_ms() - kill_ms) / 1e3;
  const double plan_s = (planned->time_ms() - detected->time_ms()) / 1e3;
  const double prefetch_s = (acked->time_ms() - planned->time_ms()) / 1e3;
  const double restart_s = (first_start - acked->time_ms()) / 1e3;
  const double restore_s = (all_restored - first_start) / 1e3;
  const double recovery_s = (all_restored - detected->time_ms()) / 1e3;
  const double node_ratio = recovery_s / raw_read_s;
  const double crash_ratio = crash->restore_s / memcpy_s;
  const double crash_all_ratio = slowest_crash_restore_s / memcpy_all_s;
  if (json) {
    std::printf(
        "{\"bytes_per_rank\":%llu,\"detect_s\":%.3f,\"plan_s\":%.3f,\"prefetch_"
        "s\":%.3f,"
        "\"trainer_restart_s\":%.3f,\"restore_s\":%.3f,\"node_recovery_s\":%."
        "3f,"
        "\"raw_read_lost_shards_s\":%.3f,\"node_recovery_ratio\":%.3f,"
        "\"crash_restore_s\":%.4f,\"crash_process_start_to_restored_s\":%.4f,"
        "\"memcpy_rank_state_s\":%.4f,\"crash_restore_ratio\":%.3f,"
        "\"crash_all_ranks_restore_s\":%.4f,\"memcpy_all_ranks_s\":%.4f,"
        "\"crash_all_ratio\":%.3f,"
        "\"restore_step\":%llu,\"shared_root\":\"%s\",\"progress_ns\":%.2f,"
        "\"replicas\":%s,\"restore_from\":\"%s\",\"raw_transfer_s\":%.3f,"
        "\"node_recovery_transfer_ratio\":%.3f}\n",
        static_cast<unsigned long long>(bytes), detect_s, plan_s, prefetch_s,
        restart_s, restore_s, recovery_s, raw_read_s, node_ratio,
        crash->restore_s, crash->process_s, memcpy_s, crash_ratio,
        slowest_crash_restore_s, memcpy_all_s, crash_all_ratio,
        static_cast<unsigned long long>(restore_step),
        object_url.empty() ? "directory" : "object store",
        progress->progress_ns, replicas ? "true" : "false",
        restore_from.c_str(), raw_tcp_s,
        raw_tcp_s > 0 ? recovery_s / raw_tcp_s : 0.0);
    return 0;
  }
  std::printf(
      "recovery_bench: 2 nodes x 2 ranks x %.2f GiB + 1 spare, heartbeat "
      "timeout %d ms\n",
      bytes / double(1 << 30), o.heartbeat_timeout_ms);
  std::printf(
      "progress beacon: %.2f ns a call (target <= 100 ns), atomic store "
      "%.2f ns\n",
      progress->progress_ns, progress->store_ns);
  std::printf("node loss (restored step %llu):\n",
              static_cast<unsigned long long>(restore_step));
  std::printf("  detection (kill -> failure detected)        %8.3f s\n",
              detect_s);
  std::printf("  plan (-> plan made)                          %8.3f s\n",
              plan_s);
  std::printf("  prefetch into the spare's memory (-> acked)  %8.3f s\n",
              prefetch_s);
  std::printf("  trainer restart (-> first trainer start)     %8.3f s\n",
              restart_s);
  std::printf("  restore (-> last rank restored)              %8.3f s\n",
              restore_s);
  std::printf("  detected -> all restored                     %8.3f s\n",
              recovery_s);
  std::printf(object_url.empty()
                  ? "  raw O_DIRECT read of the lost shards         %8.3f s\n"
                  : "  raw parallel GET of the lost shards          %8.3f s\n",
              raw_read_s);
  std::printf("  ratio %.2f (target <= 1.5): %s\n", node_ratio,
              node_ratio <= 1.5 ? "met" : "NOT met");
  if (replicas) {
    std::printf("  lost ranks restored from                     %8s\n",
                restore_from.empty() ? "-" : restore_from.c_str());
    std::printf("  plain loopback TCP of the lost shards        %8.3f s\n",
                raw_tcp_s);
    std::printf("  ratio to it %.2f (target <= 1.5): %s\n",
                recovery_s / raw_tcp_s,
                recovery_s / raw_tcp_s <= 1.5 ? "met" : "NOT met");
  }
  std::printf("trainer crash (node alive):\n");
  std::printf("  restore of rank 0 from shared memory         %8.4f s\n",
              crash->restore_s);
  std::printf("  memcpy of the rank's state                   %8.4f s\n",
              memcpy_s);
  std::printf("  process start -> restored                    %8.4f s\n",
              crash->process_s);
  std::printf("  ratio %.2f (target <= 1.2, plus process start): %s\n",
              crash_ratio, crash_ratio <= 1.2 ? "met" : "NOT met");
  std::printf(
      "  all 4 ranks restore at once: slowest %.4f s vs 4 memcpys at once %.4f "
      "s: ratio %.2f\n",
      slowest_crash_restore_s, memcpy_all_s, crash_all_ratio);
  return 0;
}
