// recovery_bench: recovery times of a multi-node job on one machine, with
// the limits they are held to measured in the same run.
//   recovery_bench [--bytes-per-rank N] [--rounds R] [--link-gbit G]
//                  [--storage-gbit G] [--port-base P] [--replicas] [--no-step]
//                  [--worker-dim D] [--worker-steps S] [--no-restart]
//                  [--restart] [--dir DIR] [--json]
//   recovery_bench --hang [--hang-timeout-min-s S] | --soak [--soak-s S]
//                  | --straggler [--slow-factor F]   [--dir DIR] [--json]
// One run reports, R rounds of each, the paths alternated
// (peer, storage, then storage, peer, ...), medians and ratios:
//  1. node loss from peers' memory: two nodes x two ranks (cluster_trainer,
//     N bytes each, default 256 MiB) and a spare, every ckptd with a
//     replica listener and a failure domain; node b is SIGKILLed with its
//     trainers and shared memory one save interval after the job staged
//     its last step (bench/node_loss_bench.h says exactly when); the spare
//     fetches ranks 2,3 from the replica holder. Limit: the same bytes over
//     one plain TCP connection on the same link (raw_transfer_s).
//  2. the same with --replicas 0 (the storage path). Limit: a raw O_DIRECT
//     read of the lost shards (raw_read_s); with --object-url s3://B/P a
//     raw parallel GET (bench/object_raw.h).
//     Targets: detected -> all restored <= 1.5 x the limit, each path.
//  3. steps lost in each (newest step saved before the kill - restored
//     step), and after a trainer crash (rank 0's trainer SIGKILLed on a
//     live node, restored from shared memory; its restore against a
//     memcpy of the rank's state).
//  4. the training step with and without replication (ckpt-worker, a save
//     every step; bench/replication_step.h): speed on/off = off/on,
//     target >= 0.97. --no-step skips it.
//  5. restarts (bench/restart_bench.h): ckpt-worker ranks, small state,
//     under ckptrun --warm 1 (a trainer SIGKILLed: survivors' in-process
//     restart and the warm replacement; then a node SIGKILLed: detection
//     from peers, one plan) and under --warm 0 (the replacement started
//     anew: the warm one's limit), alternated. In the default run, as the
//     figures the goodput model takes its restart costs from; --restart
//     runs them alone (a few seconds a round), --no-restart skips them.
//  6. resharding (bench/reshard_restore_bench.h): the job's state (4 x N
//     bytes, 8 tensors) saved at 8 ranks and restored at 6 against a
//     restore at 8, from memory, from disk after a cold restart of ckptd
//     and, with --object-url, from the object store ("reshard" in the
//     JSON: reshard_restore_s, same_layout_restore_s, plan_s, ...).
//     --reshard runs it alone, --no-reshard skips it.
// --link-gbit G shapes the bench's own ports on lo to G Gbit/s
// (bench/link_shaper.h; root and tc needed, else said why and unshaped), so
// that the plain TCP limit and the replica fetch cross the same link.
// --storage-gbit G caps reads of the disk under --dir at G Gbit/s for the
// bench and every process it starts (bench/storage_throttle.h; root and a
// block device needed, else said why and unthrottled), so that the raw
// read and the storage path's fetches read a shared root of that rate.
// The liveness modes (bench/liveness_bench.h, doc/benchmarks.md) run
// instead: --hang (a SIGSTOPped trainer: detection against the model's
// timeout), --soak (ckpt-worker under the defaults for --soak-s seconds,
// default 600: false hangs) and --straggler (a rank slowed --slow-factor
// times, default 3: windows until it is named).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "bench/link_shaper.h"
#include "bench/liveness_bench.h"
#include "bench/node_loss_bench.h"
#include "bench/progress_cost.h"
#include "bench/recovery_report.h"
#include "bench/replication_step.h"
#include "bench/storage_throttle.h"
#include "shm/huge_pages.h"
#include "util/program.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "recovery_bench: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "recovery_bench", CKPT_VERSION))
    return 0;
  if (ckpt::PrintedHelp(
          argc, argv,
          "usage: recovery_bench [--bytes-per-rank N] [--rounds R] "
          "[--link-gbit G] [--storage-gbit G] [--port-base P] [--replicas] "
          "[--no-step] [--step-only] [--worker-dim D] [--worker-steps S] "
          "[--no-restart] [--restart] [--reshard] [--no-reshard] "
          "[--dir DIR] [--json] [--keep] [--object-url s3://B/P] [--hang "
          "[--hang-timeout-min-s S]] [--soak [--soak-s S --soak-first-step-s "
          "S --soak-eval-s S]] [--straggler [--slow-factor F]]"))
    return 0;
  uint64_t bytes = 256ull << 20;
  std::string dir = "/var/tmp";
  bool json = false, keep = false, replicas = false, step = true,
       node_loss = true, restart = true, restart_only = false, reshard = true,
       reshard_only = false;
  double rounds = 3, link_gbit = 0, storage_gbit = 0, port_base = 0,
         worker_dim = 1024, worker_steps = 20;
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
      char* end = nullptr;
      bytes = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || bytes < (1 << 20) || bytes > (64ull << 30))
        return Fail("--bytes-per-rank: bytes in [1 MiB, 64 GiB]");
    } else if (a == "--rounds" && i + 1 < argc) {
      if (!number(i, 1, 20, rounds) || rounds != static_cast<int>(rounds))
        return Fail("--rounds: an integer in [1, 20]");
    } else if (a == "--link-gbit" && i + 1 < argc) {
      if (!number(i, 0.01, 400, link_gbit))
        return Fail("--link-gbit: Gbit/s in [0.01, 400]");
    } else if (a == "--storage-gbit" && i + 1 < argc) {
      if (!number(i, 0.01, 400, storage_gbit))
        return Fail("--storage-gbit: Gbit/s in [0.01, 400]");
    } else if (a == "--port-base" && i + 1 < argc) {
      if (!number(i, 1024, 65520, port_base) ||
          static_cast<int>(port_base) % 16 != 0)
        return Fail("--port-base: a multiple of 16 in [1024, 65520]");
    } else if (a == "--worker-dim" && i + 1 < argc) {
      if (!number(i, 16, 8192, worker_dim))
        return Fail("--worker-dim: the model width in [16, 8192]");
    } else if (a == "--worker-steps" && i + 1 < argc) {
      if (!number(i, 2, 100000, worker_steps))
        return Fail("--worker-steps: steps in [2, 100000]");
    } else if (a == "--no-step") {
      step = false;
    } else if (a == "--step-only") {
      node_loss = false;
      restart = false;
    } else if (a == "--no-restart") {
      restart = false;
    } else if (a == "--no-reshard") {
      reshard = false;
    } else if (a == "--reshard") {
      reshard_only = true;
    } else if (a == "--restart") {
      restart_only = true;
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
          " (--bytes-per-rank N, --rounds R, --link-gbit G, --storage-gbit G, "
          "--port-base P, "
          "--replicas, --no-step, --step-only, --no-restart, --restart, "
          "--reshard, --no-reshard, "
          "--worker-dim D, "
          "--worker-steps S, --dir DIR, --json, --keep, --object-url s3://B/P, "
          "--hang "
          "[--hang-timeout-min-s S], --soak [--soak-s S --soak-first-step-s "
          "S --soak-eval-s S], --straggler [--slow-factor F])");
    }
  }
  if (!step && !node_loss)
    return Fail("--no-step with --step-only: nothing to run");
  if (restart_only && (!restart || !node_loss))
    return Fail("--restart: not with --no-restart or --step-only");
  if (reshard_only && (!reshard || restart_only || !node_loss))
    return Fail("--reshard: not with --no-reshard, --restart or --step-only");
  if (restart_only) node_loss = step = false;
  if (storage_gbit > 0 && !object_url.empty())
    return Fail("--storage-gbit: caps a directory's disk, not --object-url");
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

  ckpt::bench::RecoveryRun run;
  run.shm_huge_pages = ckpt::shm::ShmHugePagesOf("/dev/shm");
  run.bytes_per_rank = bytes;
  run.rounds = static_cast<int>(rounds);
  run.primary_replicas = replicas;
  run.shared_root = object_url.empty() ? "directory" : "object store";
  run.progress_ns = progress->progress_ns;
  run.progress_store_ns = progress->store_ns;
  run.link_gbit = link_gbit;
  auto block = ckpt::bench::FreePortBlock(static_cast<int>(port_base));
  if (!block.ok()) return Fail(std::string(block.status().message()));
  run.port_base = *block;
  ckpt::bench::LinkShaper shaper;
  if (link_gbit > 0) {
    absl::Status shaped = shaper.Start(run.port_base, link_gbit);
    run.link_shaped = shaped.ok();
    if (!shaped.ok()) {
      run.link_note = std::string(shaped.message());
      std::fprintf(stderr, "recovery_bench: --link-gbit: not shaping: %s\n",
                   run.link_note.c_str());
    }
  }
  ckpt::bench::StorageThrottle throttle;
  run.storage_gbit = storage_gbit;
  if (storage_gbit > 0) {
    absl::Status capped = throttle.Start(root, storage_gbit);
    run.storage_throttled = capped.ok();
    if (!capped.ok()) {
      run.storage_note = std::string(capped.message());
      std::fprintf(stderr,
                   "recovery_bench: --storage-gbit: not throttling: %s\n",
                   run.storage_note.c_str());
    } else {
      run.storage_note = "disk " + throttle.device();
    }
  }
  auto log = [&](const std::string& line) {
    std::fprintf(stderr, "recovery_bench: %s\n", line.c_str());
  };
  if (reshard_only) node_loss = step = restart = false;
  for (int r = 0; node_loss && r < run.rounds; ++r) {
    // Alternated: peer first in even rounds, storage first in odd ones.
    for (bool peer : {r % 2 == 0, r % 2 != 0}) {
      ckpt::bench::NodeLossOptions o;
      o.dir =
          root + "/round-" + std::to_string(r) + (peer ? "-peer" : "-storage");
      o.bytes_per_rank = bytes;
      o.replicas = peer;
      o.port_base = run.port_base;
      o.object_url = object_url;
      o.crash = peer == replicas;  // the crash after the primary path's loss
      auto f = ckpt::bench::RunNodeLossRound(o);
      if (!f.ok()) return Fail(std::string(f.status().message()));
      log(absl::StrFormat(
          "round %d %s: detected -> restored %.3f s, limit "
          "%.3f s, restored step %llu of %llu\n%s",
          r, peer ? "peer" : "storage", f->recovery_s, f->limit_s,
          static_cast<unsigned long long>(f->restore_step),
          static_cast<unsigned long long>(f->reached_step), f->timeline));
      (peer ? run.peer : run.storage).push_back(*std::move(f));
      if (!keep) std::filesystem::remove_all(o.dir);
    }
  }
  for (int r = 0; step && r < run.rounds; ++r) {
    for (bool on : {r % 2 != 0, r % 2 == 0}) {
      ckpt::bench::ReplicationStepOptions o;
      o.dir = root + "/step-" + std::to_string(r) + (on ? "-on" : "-off");
      o.replicas = on;
      o.port_base = run.port_base;
      o.dim = static_cast<int>(worker_dim);
      o.steps = static_cast<int>(worker_steps);
      auto f = ckpt::bench::MeasureReplicationStep(o);
      if (!f.ok()) return Fail(std::string(f.status().message()));
      log(absl::StrFormat("step round %d replication %s: %.4f s a step", r,
                          on ? "on" : "off", f->step_s));
      (on ? run.step_on : run.step_off).push_back(*f);
      if (!keep) std::filesystem::remove_all(o.dir);
    }
  }
  for (int r = 0; restart && r < run.rounds; ++r) {
    // Alternated: warm first in even rounds, cold first in odd ones.
    for (bool warm : {r % 2 == 0, r % 2 != 0}) {
      ckpt::bench::RestartOptions o;
      o.dir =
          root + "/restart-" + std::to_string(r) + (warm ? "-warm" : "-cold");
      o.warm = warm ? 1 : 0;
      o.node_loss = warm;
      o.heartbeat_timeout_ms = run.heartbeat_timeout_ms;
      auto f = ckpt::bench::RunRestartRound(o);
      if (!f.ok()) return Fail(std::string(f.status().message()));
      log(absl::StrFormat(
          "restart round %d --warm %d: step %.4f s; trainer "
          "killed -> survivors %.3f s, replacement %.3f s; "
          "%d plans for %d failures\n%s",
          r, o.warm, f->step_s, f->survivors_s, f->replacement_s, f->plans,
          f->failures, f->timeline));
      (warm ? run.restart_warm : run.restart_cold).push_back(*std::move(f));
      if (!keep) std::filesystem::remove_all(o.dir);
    }
  }
  if (reshard_only || (node_loss && reshard)) {
    ckpt::bench::Options ro;
    ro.bytes = 4 * bytes;
    ro.tensors = 8;
    ro.repeat = run.rounds;
    ro.root = root;
    ro.keep = keep;
    ro.object_url = object_url;
    auto f = ckpt::bench::MeasureReshard(ro, 8, 6);
    if (!f.ok()) return Fail("reshard: " + std::string(f.status().message()));
    if (!f->restore_matches)
      return Fail("reshard: restored bytes differ from the saved ones");
    log(ckpt::bench::ReshardText(*f));
    run.reshard = *f;
    run.reshard_measured = true;
  }
  shaper.Stop();
  std::fputs(
      (json ? ckpt::bench::RecoveryJson(run) : ckpt::bench::RecoveryText(run))
          .c_str(),
      stdout);
  return 0;
}
