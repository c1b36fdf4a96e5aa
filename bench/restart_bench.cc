#include "bench/restart_bench.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cluster_events.h"
#include "bench/stats.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using ckpt::testing::Cluster;
using ckpt::testing::ClusterOptions;
using std::chrono::seconds;

constexpr uint32_t kRestartWorld = 4;

// The job: long enough never to end during a round (the cluster is torn
// down after it), a save every 5 steps, every step logged with its rank
// and CLOCK_MONOTONIC time. A model whose step takes some milliseconds
// of real compute on one core, so that a step time means something.
std::vector<std::string> RestartWorkerCommand() {
  return {CKPT_WORKER_BINARY,
          "--steps",
          "100000",
          "--ckpt-every",
          "5",
          "--vocab",
          "256",
          "--dim",
          "128",
          "--layers",
          "2",
          "--seq",
          "32",
          "--batch",
          "32",
          "--seed",
          "7",
          "--log-every",
          "1",
          "--log-mono",
          "--cpu-threads",
          "1",
          "--collective-timeout-s",
          "60"};
}

double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = 0;
  in >> load;
  return load;
}

// The nodes' ckptrun logs (the trainers' output), read as they grow.
class NodeLogs {
 public:
  NodeLogs(const Cluster& c, std::vector<std::string> nodes) {
    for (auto& id : nodes) files_.push_back({c.LauncherLogPath(id), 0, ""});
  }

  struct Step {
    uint32_t rank;
    int64_t step;
    long long mono_ms;
  };

  void Update() {
    for (auto& f : files_) {
      std::ifstream in(f.path, std::ios::binary);
      if (!in) continue;
      in.seekg(static_cast<std::streamoff>(f.offset));
      std::string chunk((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
      f.offset += chunk.size();
      f.partial += chunk;
      size_t start = 0;
      for (size_t nl; (nl = f.partial.find('\n', start)) != std::string::npos;
           start = nl + 1)
        Parse(f.partial.substr(start, nl - start));
      f.partial.erase(0, start);
    }
  }

  // The first step line of `rank` for `step` finished after `after_ms`.
  std::optional<long long> FirstStep(uint32_t rank, int64_t step,
                                     long long after_ms) const {
    for (const auto& s : steps_)
      if (s.rank == rank && s.step == step && s.mono_ms > after_ms)
        return s.mono_ms;
    return std::nullopt;
  }
  // The newest step any line of `rank` finished after `after_ms` (0: none).
  int64_t NewestAfter(uint32_t rank, long long after_ms) const {
    int64_t newest = 0;
    for (const auto& s : steps_)
      if (s.rank == rank && s.mono_ms > after_ms)
        newest = std::max(newest, s.step);
    return newest;
  }
  long long LastMono() const {
    return steps_.empty() ? 0 : steps_.back().mono_ms;
  }
  // Median time between `rank`'s consecutive steps before `before_ms`,
  // skipping the first 3 (start-up).
  double StepSeconds(uint32_t rank, long long before_ms) const {
    std::vector<double> gaps;
    std::optional<Step> prev;
    int seen = 0;
    for (const auto& s : steps_) {
      if (s.rank != rank || s.mono_ms >= before_ms) continue;
      if (prev && s.step == prev->step + 1 && ++seen > 3)
        gaps.push_back((s.mono_ms - prev->mono_ms) / 1e3);
      prev = s;
    }
    return Median(gaps);
  }
  size_t Count(const std::string& what) const {
    size_t n = 0;
    for (size_t at = other_.find(what); at != std::string::npos;
         at = other_.find(what, at + 1))
      ++n;
    return n;
  }
  // Lines that are not step lines, for a failure's message.
  const std::string& other() const { return other_; }

 private:
  struct File {
    std::string path;
    size_t offset;
    std::string partial;
  };
  void Parse(const std::string& line) {
    unsigned rank = 0;
    long long step = 0, mono = 0;
    float loss = 0;
    if (std::sscanf(line.c_str(), "step %lld loss %f rank=%u mono_ms=%lld",
                    &step, &loss, &rank, &mono) == 4) {
      steps_.push_back({rank, step, mono});
      return;
    }
    if (line.rfind("eval step", 0) != 0) absl::StrAppend(&other_, line, "\n");
  }
  std::vector<File> files_;
  std::vector<Step> steps_;
  std::string other_;
};

// The job's generation and restore step once the plan after `gen` is
// acknowledged (no restore step: a fresh start, step 0).
std::optional<std::pair<uint64_t, int64_t>> PlanAfter(const Cluster& c,
                                                      uint64_t gen) {
  auto j = c.Job();
  if (!j || j->generation() <= gen || j->plan_state() != cv1::PLAN_ACKNOWLEDGED)
    return std::nullopt;
  return std::make_pair(
      j->generation(),
      j->has_restore_step() ? static_cast<int64_t>(j->restore_step()) : 0);
}

// Waits for the plan after generation `gen` and every rank's first step
// after its restore; returns the generation, the restore step and each
// rank's first step time. A step line counts once the plan was made: a
// step whose allreduce the killed rank had fed may still finish just
// after the kill, and may bear the number the restored job trains next.
struct Recovered {
  uint64_t generation = 0;
  int64_t restore_step = 0;
  std::vector<long long> first_ms;
};
absl::StatusOr<Recovered> WaitRecovered(const Cluster& c, NodeLogs& logs,
                                        uint64_t gen, long long kill_ms,
                                        const char* what) {
  Recovered r;
  std::optional<std::pair<uint64_t, int64_t>> plan;
  std::optional<cv1::Event> made;
  if (!Cluster::WaitUntil(
          [&] {
            if (!plan && !(plan = PlanAfter(c, gen))) return false;
            if (!made &&
                !(made = FirstEvent(c.Events(), cv1::PLAN_MADE, kill_ms)))
              return false;
            logs.Update();
            r.first_ms.clear();
            for (uint32_t k = 0; k < kRestartWorld; ++k) {
              auto t = logs.FirstStep(k, plan->second + 1, made->time_ms());
              if (!t) return false;
              r.first_ms.push_back(*t);
            }
            return true;
          },
          seconds(120)))
    return Failed(absl::StrCat(what,
                               ": not every rank trained its first "
                               "step after the restore\n",
                               logs.other()),
                  c);
  r.generation = plan->first;
  r.restore_step = plan->second;
  return r;
}

}  // namespace

absl::StatusOr<RestartFigures> RunRestartRound(const RestartOptions& o) {
  RestartFigures f;
  f.warm = o.warm;
  ClusterOptions co;
  co.dir = o.dir;
  co.world_size = kRestartWorld;
  co.heartbeat_timeout_ms = o.heartbeat_timeout_ms;
  co.trainer_command = RestartWorkerCommand();
  co.launcher_args = {"--warm", std::to_string(o.warm)};
  Cluster c(co);
  c.StartCoordinator();
  c.StartNode("a");  // ranks 0, 1
  c.StartNode("b");  // ranks 2, 3
  if (o.node_loss) c.StartNode("c", /*spare=*/true);
  std::vector<std::string> nodes = {"a", "b"};
  if (o.node_loss) nodes.push_back("c");
  NodeLogs logs(c, nodes);

  // A good checkpoint to restore, some steps to time, and the warm
  // processes waiting (node a's takes the killed rank, c's one of b's).
  const size_t warm_waiting = o.warm > 0 ? nodes.size() - 1 : 0;
  if (!Cluster::WaitUntil(
          [&] {
            logs.Update();
            for (uint32_t k = 0; k < kRestartWorld; ++k)
              if (logs.NewestAfter(k, 0) < 12) return false;
            auto j = c.Job();
            return j && j->has_last_good() && j->last_good_step() >= 5 &&
                   logs.Count("): waiting for a rank") >= warm_waiting;
          },
          seconds(120)))
    return Failed("the job never trained 12 steps with a good checkpoint\n" +
                      logs.other(),
                  c);
  const pid_t victim = c.WorkerPid(1, "a");
  if (victim <= 0) return Failed("no ckpt-worker of rank 1 on node a", c);
  f.load_1m = LoadAverage();
  const long long kill_ms = MonoMs();
  if (kill(victim, SIGKILL) != 0) return Failed("cannot kill rank 1", c);
  ++f.failures;
  f.step_s = logs.StepSeconds(0, kill_ms);
  CKPT_ASSIGN_OR_RETURN(Recovered one,
                        WaitRecovered(c, logs, 0, kill_ms, "trainer killed"));
  for (uint32_t k : {0u, 2u, 3u})
    f.survivors_s = std::max(f.survivors_s, (one.first_ms[k] - kill_ms) / 1e3);
  f.replacement_s = (one.first_ms[1] - kill_ms) / 1e3;
  f.survivors = 3;
  const std::string gen1 = absl::StrCat("generation ", one.generation, ": ");
  for (uint32_t k : {0u, 2u, 3u})
    f.kept +=
        logs.Count(absl::StrCat(gen1, "rank ", k, " keeps its process")) > 0;
  f.replacement_warm =
      logs.Count(absl::StrCat(gen1, "rank 1 placed in a warm process")) > 0;
  absl::StrAppend(&f.timeline,
                  absl::StrFormat("  trainer kill (load %.2f): generation %u, "
                                  "restore step %d; first steps (ms after the "
                                  "kill):",
                                  f.load_1m, one.generation, one.restore_step));
  for (long long t : one.first_ms)
    absl::StrAppend(&f.timeline, " ", t - kill_ms);
  absl::StrAppend(&f.timeline, "\n");
  // The coordinator's side of the recovery, for the phases of the
  // breakdown (doc/benchmarks.md): failure, plan, orders, acknowledgement.
  const long long last_ms =
      *std::max_element(one.first_ms.begin(), one.first_ms.end());
  for (const auto& e : c.Events())
    if (e.time_ms() >= kill_ms && e.time_ms() <= last_ms)
      absl::StrAppend(&f.timeline, "    +", e.time_ms() - kill_ms, " ms ",
                      cv1::EventKind_Name(e.kind()), " ", e.node_id(), " ",
                      e.detail().substr(0, 80), "\n");

  long long end_ms = one.first_ms[1];
  if (o.node_loss) {
    // The job trains on, its warm processes refilled, before b dies.
    if (!Cluster::WaitUntil(
            [&] {
              logs.Update();
              for (uint32_t k = 0; k < kRestartWorld; ++k)
                if (logs.NewestAfter(k, kill_ms) < one.restore_step + 8)
                  return false;
              return logs.Count("): waiting for a rank") >=
                     warm_waiting + (o.warm > 0 && f.replacement_warm);
            },
            seconds(120)))
      return Failed(
          "the job did not train on after the trainer kill\n" + logs.other(),
          c);
    f.node_load_1m = LoadAverage();
    const long long node_ms = MonoMs();
    c.KillNode("b");
    ++f.failures;
    CKPT_ASSIGN_OR_RETURN(
        Recovered two,
        WaitRecovered(c, logs, one.generation, node_ms, "node b killed"));
    for (long long t : two.first_ms)
      f.node_first_step_s = std::max(f.node_first_step_s, (t - node_ms) / 1e3);
    const std::string gen2 = absl::StrCat("generation ", two.generation, ": ");
    for (uint32_t k : {0u, 1u})
      f.node_kept +=
          logs.Count(absl::StrCat(gen2, "rank ", k, " keeps its process")) > 0;
    std::vector<cv1::Event> events;
    std::optional<cv1::Event> dead;
    Cluster::WaitUntil(
        [&] {
          events = c.Events();
          return (dead = FirstEvent(events, cv1::FAILURE_DETECTED, node_ms - 10,
                                    "b"))
              .has_value();
        },
        seconds(60));
    if (!dead) return Failed("no FAILURE_DETECTED event for node b", c);
    f.detect_s = (dead->time_ms() - node_ms) / 1e3;
    f.detected_by_probe = dead->detail().find("probe") != std::string::npos;
    if (auto s = FirstEvent(events, cv1::PEER_SUSPECTED, node_ms))
      f.suspected_s = (s->time_ms() - node_ms) / 1e3;
    absl::StrAppend(
        &f.timeline,
        absl::StrFormat("  node b kill (load %.2f): generation %u, restore "
                        "step %d; b declared dead +%d ms (%s); first steps "
                        "(ms after the kill):",
                        f.node_load_1m, two.generation, two.restore_step,
                        dead->time_ms() - node_ms,
                        dead->detail().substr(0, 80)));
    for (long long t : two.first_ms)
      absl::StrAppend(&f.timeline, " ", t - node_ms);
    absl::StrAppend(&f.timeline, "\n");
    end_ms = node_ms;
  }
  // Plans are counted once the job trained past the moment a heartbeat
  // timeout (plus its check) would have planned a second time.
  const long long settled_ms = end_ms + o.heartbeat_timeout_ms + 1000;
  if (!Cluster::WaitUntil(
          [&] {
            logs.Update();
            return logs.LastMono() > settled_ms;
          },
          seconds(120)))
    return Failed(
        "the job stopped training after the failures\n" + logs.other(), c);
  // Events() gives up after 2 s, which a loaded machine can take.
  std::vector<cv1::Event> events;
  Cluster::WaitUntil([&] { return !(events = c.Events()).empty(); },
                     seconds(60));
  for (const auto& e : events) {
    if (e.kind() != cv1::PLAN_MADE) continue;
    ++f.plans;
    absl::StrAppend(&f.timeline, "  PLAN_MADE ", e.time_ms() - kill_ms,
                    " ms after the trainer kill: ", e.detail().substr(0, 100),
                    "\n");
  }
  return f;
}

}  // namespace ckpt::bench
