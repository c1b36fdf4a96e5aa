#include "bench/liveness_bench.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cluster_events.h"
#include "tests/cluster_harness.h"

namespace ckpt::bench {
namespace {

namespace cv1 = ::ckpt::coord::v1;
using ckpt::testing::Cluster;
using ckpt::testing::ClusterOptions;
using std::chrono::seconds;

int CountEvents(const std::vector<cv1::Event>& events, cv1::EventKind kind) {
  return static_cast<int>(
      std::count_if(events.begin(), events.end(),
                    [&](const cv1::Event& e) { return e.kind() == kind; }));
}

// ckpt-worker with a model whose compute takes milliseconds a step (so
// compute_s is a figure, not a rounding error), and `flags` over it.
std::vector<std::string> WorkerCommand(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {CKPT_WORKER_BINARY,
                                   "--vocab",
                                   "256",
                                   "--dim",
                                   "128",
                                   "--layers",
                                   "2",
                                   "--seq",
                                   "32",
                                   "--batch",
                                   "64",
                                   "--seed",
                                   "3"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return argv;
}

std::string AllLauncherLogs(const Cluster& c,
                            const std::vector<std::string>& nodes) {
  std::string out;
  for (const auto& n : nodes) out += c.LauncherLog(n);
  return out;
}

}  // namespace

absl::StatusOr<HangFigures> MeasureHang(const std::string& dir,
                                        double timeout_min_s) {
  ClusterOptions o;
  o.dir = dir + "/hang";
  o.world_size = 4;
  o.bytes_per_rank = 8 << 20;
  o.step_ms = 100;
  o.last_step = 100000;  // nobody finishes before the hang
  o.coordinator_args = {"--hang-timeout-min-s",
                        absl::StrFormat("%g", timeout_min_s),
                        "--first-step-timeout-s", "120"};
  HangFigures f;
  f.timeout_min_s = timeout_min_s;
  f.node_ranks = static_cast<int>(o.nproc_per_node);
  Cluster c(o);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  auto last_good = [&]() -> uint64_t {
    auto j = c.Job();
    return j && j->has_last_good() ? j->last_good_step() : 0;
  };
  if (!Cluster::WaitUntil([&] { return last_good() >= 5; }, seconds(120)))
    return Failed("the job never made step 5 durable", c);
  const pid_t victim = c.TrainerPid(1);
  if (victim <= 0 || kill(victim, SIGSTOP) != 0)
    return Failed("cannot stop rank 1's trainer", c);
  const int64_t stopped_ms = MonoMs();
  std::optional<cv1::Event> hang;
  const auto wait = seconds(static_cast<int64_t>(timeout_min_s * 10) + 60);
  if (!Cluster::WaitUntil(
          [&] {
            return (hang = FirstEvent(c.Events(), cv1::HANG_DETECTED))
                .has_value();
          },
          wait))
    return Failed("no HANG_DETECTED", c);
  f.detect_s = static_cast<double>(hang->time_ms() - stopped_ms) / 1000.0;
  f.timeout_s = hang->hang().timeout_s();
  f.silent_s = hang->hang().silent_s();
  f.named = hang->hang().ranks_size() == 1 && hang->hang().ranks(0) == 1;

  // The restarted job: every rank restores one step and checks its bytes.
  std::set<uint64_t> steps;
  f.resumed = Cluster::WaitUntil(
      [&] {
        steps.clear();
        for (uint32_t r = 0; r < o.world_size; ++r) {
          bool restored = false;
          for (const auto& l : c.TrainerLog(r)) {
            if (l.kind == "mismatch" || l.kind == "restore_failed")
              return true;  // judged below
            if (l.kind == "restored") {
              restored = true;
              steps.insert(std::stoull(l.fields.at("step")));
            }
          }
          if (!restored) return false;
        }
        return true;
      },
      seconds(120));
  for (uint32_t r = 0; r < o.world_size; ++r)
    for (const auto& l : c.TrainerLog(r))
      if (l.kind == "mismatch" || l.kind == "restore_failed") f.resumed = false;
  f.resumed = f.resumed && steps.size() == 1;
  if (!steps.empty()) f.restore_step = *steps.begin();

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  cv1::GetStacksRequest req;
  req.set_job(o.job);
  cv1::GetStacksResponse resp;
  if (c.Stub()->GetStacks(&ctx, req, &resp).ok()) {
    std::set<uint32_t> ranks;
    for (const auto& report : resp.reports())
      if (report.node_id() == hang->node_id())
        for (const auto& rs : report.ranks())
          if (!rs.text().empty()) ranks.insert(rs.rank());
    f.stacks_ranks = static_cast<int>(ranks.size());
  }
  return f;
}

absl::StatusOr<SoakFigures> RunSoak(const std::string& dir,
                                    const SoakOptions& options) {
  SoakFigures f;
  f.seconds = options.seconds;
  f.first_step_s = options.first_step_s >= 0
                       ? options.first_step_s
                       : std::min(150.0, options.seconds / 4);
  f.eval_s = options.eval_s;
  ClusterOptions o;
  o.dir = dir + "/soak";
  o.world_size = 2;
  o.nproc_per_node = 1;
  // The coordinator's defaults: no hang, first-step or straggler flag.
  o.trainer_command = WorkerCommand(
      {"--steps", "1000000000", "--ckpt-every", "1", "--eval-every", "50",
       "--eval-s", absl::StrFormat("%g", f.eval_s), "--slow-first-step-s",
       absl::StrFormat("%g", f.first_step_s), "--log-every", "10",
       "--collective-timeout-s", "900"});
  Cluster c(o);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::duration<double>(options.seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    for (const char* n : {"a", "b"})
      if (c.LauncherStatus(n).has_value())
        return Failed(absl::StrCat("ckptrun of node ", n, " exited"), c);
  }
  const std::vector<cv1::Event> events = c.Events();
  f.false_hangs = CountEvents(events, cv1::HANG_DETECTED);
  f.failures = CountEvents(events, cv1::FAILURE_DETECTED);
  f.stragglers = CountEvents(events, cv1::STRAGGLER);
  const std::string logs = AllLauncherLogs(c, {"a", "b"});
  static const std::regex step_line(R"(\nstep (\d+) loss )");
  for (auto it = std::sregex_iterator(logs.begin(), logs.end(), step_line);
       it != std::sregex_iterator(); ++it)
    f.steps = std::max<int64_t>(f.steps, std::stoll((*it)[1]));
  for (size_t at = logs.find("\neval step "); at != std::string::npos;
       at = logs.find("\neval step ", at + 1))
    ++f.evals;
  return f;
}

absl::StatusOr<StragglerFigures> MeasureStraggler(const std::string& dir,
                                                  double factor) {
  StragglerFigures f;
  f.factor = factor;
  f.rank = 2;  // node b's first rank
  ClusterOptions o;
  o.dir = dir + "/straggler";
  o.world_size = 4;
  o.trainer_command =
      WorkerCommand({"--steps", "1000000000", "--ckpt-every", "10",
                     "--fault-slow", absl::StrFormat("%u:%g", f.rank, factor),
                     "--log-every", "1", "--collective-timeout-s", "120"});
  Cluster c(o);
  c.StartCoordinator();
  c.StartNode("a");
  c.StartNode("b");
  int64_t first_step_ms = 0;
  if (!Cluster::WaitUntil(
          [&] {
            if (AllLauncherLogs(c, {"a", "b"}).find("\nstep 1 loss ") ==
                std::string::npos)
              return false;
            first_step_ms = MonoMs();
            return true;
          },
          seconds(120)))
    return Failed("the job never logged its first step", c);
  auto named = [&](const std::vector<cv1::Event>& events) {
    for (const auto& e : events)
      if (e.kind() == cv1::STRAGGLER && e.straggler().rank() == f.rank)
        return std::optional<cv1::Event>(e);
    return std::optional<cv1::Event>();
  };
  std::optional<cv1::Event> event;
  Cluster::WaitUntil([&] { return (event = named(c.Events())).has_value(); },
                     seconds(static_cast<int64_t>(10 * f.window_s)));
  // Two windows more: nobody else may be named meanwhile either.
  std::this_thread::sleep_for(
      std::chrono::duration<double>(2 * f.window_s + 1));
  const std::vector<cv1::Event> events = c.Events();
  for (const auto& e : events)
    if (e.kind() == cv1::STRAGGLER && e.straggler().rank() != f.rank)
      ++f.other_stragglers;
  f.named = event.has_value();
  if (f.named) {
    f.detect_s = static_cast<double>(event->time_ms() - first_step_ms) / 1e3;
    f.windows_to_detect = f.detect_s / f.window_s;
  }
  if (CountEvents(events, cv1::FAILURE_DETECTED) +
          CountEvents(events, cv1::HANG_DETECTED) >
      0)
    return Failed("the job failed or hung while a rank was slow", c);
  return f;
}

}  // namespace ckpt::bench
