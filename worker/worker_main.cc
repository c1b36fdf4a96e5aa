// ckpt-worker: trains the MLP language model of worker/mlp_model.h on
// synthetic data with the chunked offloaded AdamW, checkpointing through
// libckpt. Environment (read here and only here):
//   CKPT_SOCKET, CKPT_JOB  the daemon and job; without CKPT_SOCKET the run
//                          trains without checkpoints
//   RANK, WORLD_SIZE       this process's place in the job (default 0 of 1)
//   LOCAL_RANK             its place on this node (checked, not otherwise used)
//   MASTER_ADDR, MASTER_PORT  where rank 0 serves the rendezvous store
//                          (default 127.0.0.1:29500; needed when WORLD_SIZE >
//                          1)
//   CKPT_RENDEZVOUS        "launcher": ckptrun serves the store there for
//                          every generation and rank 0 serves none
//   GLOO_SOCKET_IFNAME     bind gloo to this interface instead of the one
//                          that reaches MASTER_ADDR
//   CKPT_RESTORE_STEP      restore this step instead of the latest one
//   CKPT_RESTORE_RANK, CKPT_RESTORE_WORLD_SIZE  the step was saved at
//                          another world size (a resized job): restore
//                          that saved rank's shard (every rank holds the
//                          whole state) and train on at WORLD_SIZE, the
//                          batch re-partitioned over it. With --zero1
//                          CKPT_RESTORE_WORLD_SIZE alone is enough: each
//                          rank reshards its new slice from every saved
//                          rank's pieces (CKPT_RESTORE_RANK is ignored)
//   CKPT_GENERATION        the job generation (carried by every save)
//   CKPT_RESTART_DIR       ckptrun's directory of in-process restart: the
//                          worker says it can restart in its process, and
//                          on each new plan there leaves its step (breaking
//                          a collective blocked on a dead peer), joins the
//                          plan's rendezvous, restores the plan's step from
//                          ckptd in place and trains on; a collective broken
//                          by a dead peer waits for the plan instead of
//                          exiting (--no-in-process-restart: exit, as
//                          before)
//   CKPT_WARM              1: a warm process of ckptrun --warm, started with
//                          no rank: it waits for its first plan and takes
//                          rank, world, rendezvous and restore step from it
// Prints "step N loss X" lines and, last, "rank=R ... params_digest=<16 hex
// digits>"; under in-process restart also "generation G: ..." lines (a
// restart requested, the generation left with this process's rss_kb, fds
// and threads, the step trained from).
#include <dirent.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/program.h"
#include "util/status.h"
#include "worker/data_parallel.h"
#include "worker/phase_trace.h"
#include "worker/restart_monitor.h"
#include "worker/trainer.h"

namespace {

using ckpt::RestartPlan;
using ckpt::worker::DataParallel;
using ckpt::worker::DataParallelOptions;
using ckpt::worker::RestartMonitor;
using ckpt::worker::Trainer;
using ckpt::worker::TrainerOptions;

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// $name as an int64 in [lo, hi]; `fallback` when unset.
absl::StatusOr<std::optional<int64_t>> EnvInt(const char* name, int64_t lo,
                                              int64_t hi) {
  const char* text = Env(name);
  if (text == nullptr) return std::optional<int64_t>();
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("$", name, " = \"", text,
                                                   "\": not an integer in [",
                                                   lo, ", ", hi, "]"));
  }
  return std::optional<int64_t>(v);
}

// One generation's assignment: from the environment, or from a plan.
struct Assignment {
  uint64_t generation = 0;
  bool generation_known = false;  // $CKPT_GENERATION or a plan said it
  RestartPlan plan;               // rank, world size, rendezvous, restore
  // $CKPT_RESTORE_RANK: the restore step's saved rank (another world size).
  std::optional<ckpt::worker::SavedRank> restore_from;
};

Assignment FromPlan(const RestartPlan& plan) {
  return Assignment{plan.generation, true, plan, std::nullopt};
}

// "rss_kb=R fds=F threads=T shmem_kb=S" of this process, from /proc/self:
// what an in-process restart must leave flat. Taken once the old
// generation is torn down and before the next one is joined, so it counts
// what each restart leaves behind, not what a restore holds for a moment
// (RssShmem: the part of RSS that is shared memory, ckptd's arenas).
std::string Footprint() {
  long rss_kb = -1, shmem_kb = -1, threads = -1;
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      std::sscanf(line, "VmRSS: %ld", &rss_kb);
      std::sscanf(line, "RssShmem: %ld", &shmem_kb);
      std::sscanf(line, "Threads: %ld", &threads);
    }
    std::fclose(f);
  }
  long fds = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++fds;
    closedir(d);
    fds -= 3;  // ".", "..", and the descriptor of this listing
  }
  return absl::StrCat("rss_kb=", rss_kb, " fds=", fds, " threads=", threads,
                      " shmem_kb=", shmem_kb);
}

// Rendezvous, client, restore (in place when `trainer` exists), and the
// training of one generation.
absl::Status RunGeneration(const TrainerOptions& options, const Assignment& a,
                           std::unique_ptr<DataParallel>& comm,
                           std::unique_ptr<Trainer>& trainer,
                           const std::atomic<bool>* stop) {
  ckpt::worker::Phase("rdv_begin", options.rank);
  CKPT_RETURN_IF_ERROR(comm->Rendezvous());
  ckpt::worker::Phase("rdv_done", options.rank);
  std::unique_ptr<ckpt::Client> client;
  if (Env("CKPT_SOCKET") != nullptr) {
    ckpt::ClientOptions co;
    co.rank = options.rank;
    co.world_size = options.world_size;
    if (a.generation_known) co.generation = a.generation;
    CKPT_ASSIGN_OR_RETURN(client, ckpt::Client::Connect(co));
    ckpt::worker::Phase("client_connected", options.rank);
  } else if (a.plan.restore_step.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "restore step ", *a.plan.restore_step,
        " ($CKPT_RESTORE_STEP or the plan) but $CKPT_SOCKET is not set"));
  } else if (trainer == nullptr) {
    std::printf("no $CKPT_SOCKET: training without checkpoints\n");
  }
  int64_t start = 0;
  if (trainer == nullptr) {
    CKPT_ASSIGN_OR_RETURN(
        trainer, Trainer::Create(options, std::move(client), std::move(comm)));
    trainer->SetStopFlag(stop);
    ckpt::worker::Phase("trainer_created", options.rank);
    if (options.zero1) std::printf("%s\n", trainer->PartitionSummary().c_str());
    CKPT_ASSIGN_OR_RETURN(
        start, trainer->Restore(a.plan.restore_step, a.restore_from));
  } else {
    CKPT_ASSIGN_OR_RETURN(
        start, trainer->JoinGeneration(std::move(client), std::move(comm),
                                       *a.plan.restore_step));
  }
  ckpt::worker::Phase("restored", options.rank);
  if (start > 0)
    std::printf("restored step %lld\n", static_cast<long long>(start));
  if (stop != nullptr) {
    std::printf("generation %llu: training from step %lld\n",
                static_cast<unsigned long long>(a.generation),
                static_cast<long long>(start));
  }
  std::fflush(stdout);
  return trainer->Run(stdout);
}

absl::Status Main(TrainerOptions options, DataParallelOptions dp,
                  bool in_process_restart) {
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> rank,
                        EnvInt("RANK", 0, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> world,
                        EnvInt("WORLD_SIZE", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> local_rank,
                        EnvInt("LOCAL_RANK", 0, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> port,
                        EnvInt("MASTER_PORT", 1, 65535));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> restore_step,
                        EnvInt("CKPT_RESTORE_STEP", 0, int64_t{1} << 62));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> generation,
                        EnvInt("CKPT_GENERATION", 0, int64_t{1} << 62));
  CKPT_ASSIGN_OR_RETURN(std::optional<int64_t> restore_world,
                        EnvInt("CKPT_RESTORE_WORLD_SIZE", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(
      std::optional<int64_t> restore_rank,
      EnvInt("CKPT_RESTORE_RANK", 0, restore_world.value_or(1 << 20) - 1));
  if ((restore_rank.has_value() && !restore_world.has_value()) ||
      (restore_world.has_value() && !restore_rank.has_value() &&
       !options.zero1) ||
      (restore_world.has_value() && !restore_step.has_value()))
    return absl::InvalidArgumentError(
        "$CKPT_RESTORE_RANK: needs $CKPT_RESTORE_WORLD_SIZE and "
        "$CKPT_RESTORE_STEP (and they it; with --zero1 "
        "$CKPT_RESTORE_WORLD_SIZE needs only $CKPT_RESTORE_STEP)");
  Assignment a;
  a.generation = static_cast<uint64_t>(generation.value_or(0));
  a.generation_known = generation.has_value();
  a.plan.rank = static_cast<uint32_t>(rank.value_or(0));
  a.plan.world_size = static_cast<uint32_t>(world.value_or(1));
  a.plan.master_addr =
      Env("MASTER_ADDR") != nullptr ? Env("MASTER_ADDR") : dp.master_addr;
  a.plan.master_port = static_cast<uint32_t>(port.value_or(dp.master_port));
  a.plan.restore_step = restore_step;
  if (restore_world.has_value())
    a.restore_from =
        ckpt::worker::SavedRank{static_cast<uint32_t>(restore_rank.value_or(0)),
                                static_cast<uint32_t>(*restore_world)};
  if (local_rank.has_value() && *local_rank > a.plan.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "$LOCAL_RANK = ", *local_rank, ": above $RANK = ", a.plan.rank));
  }
  if (Env("GLOO_SOCKET_IFNAME") != nullptr)
    dp.iface = Env("GLOO_SOCKET_IFNAME");
  if (const char* r = Env("CKPT_RENDEZVOUS"); r != nullptr && *r != '\0') {
    if (std::string(r) != "launcher")
      return absl::InvalidArgumentError(absl::StrCat(
          "$CKPT_RENDEZVOUS = \"", std::string(r).substr(0, 32),
          "\": not \"launcher\" (unset: rank 0 serves the store)"));
    dp.store_served = true;
  }

  // In-process restart: under a launcher that hands out plans, and unless
  // --no-in-process-restart.
  std::unique_ptr<RestartMonitor> monitor;
  // A warm process (ckptrun --warm): started ahead with no rank; its first
  // plan says which rank it is.
  const bool warm =
      Env("CKPT_WARM") != nullptr && std::string_view(Env("CKPT_WARM")) == "1";
  if (warm && (!in_process_restart || Env("CKPT_RESTART_DIR") == nullptr)) {
    return absl::FailedPreconditionError(
        "$CKPT_WARM = 1: a warm process takes its rank from a plan in "
        "$CKPT_RESTART_DIR, which needs in-process restart (no "
        "--no-in-process-restart) and ckptrun");
  }
  if (warm) {
    CKPT_RETURN_IF_ERROR(ckpt::EnableRestart());
    monitor = std::make_unique<RestartMonitor>(
        Env("CKPT_RESTART_DIR"), 0, std::chrono::milliseconds(10), stdout);
    std::printf("warm process (pid %d): waiting for a rank\n",
                static_cast<int>(getpid()));
    std::fflush(stdout);
    a = FromPlan(monitor->TakePlan());
    ckpt::worker::Phase("warm_placed", -1);
    // A plan rewritten for a newer generation before this process read
    // the first one finds it kept: it says it joined, as a kept one does.
    CKPT_RETURN_IF_ERROR(ckpt::JoinedRestart(a.generation));
    std::printf("generation %llu: rank %u of %u, placed in this warm process\n",
                static_cast<unsigned long long>(a.generation), a.plan.rank,
                a.plan.world_size);
    std::fflush(stdout);
  } else if (in_process_restart && Env("CKPT_RESTART_DIR") != nullptr) {
    if (absl::Status s = ckpt::EnableRestart(); !s.ok()) {
      std::fprintf(stderr,
                   "ckpt-worker: in-process restart off (the launcher "
                   "restarts this process instead): %s\n",
                   s.ToString().c_str());
    } else {
      // The launcher's plan, when there is one, is the newest assignment.
      CKPT_ASSIGN_OR_RETURN(std::optional<RestartPlan> plan,
                            ckpt::PollRestart(0));
      if (plan.has_value()) {
        // The plan file carries no saved rank: the environment's holds
        // for the generation it was started in (ckptrun starts a resized
        // job's ranks as fresh processes).
        std::optional<ckpt::worker::SavedRank> from = a.restore_from;
        const uint64_t started_in = a.generation;
        a = FromPlan(*plan);
        if (a.generation == started_in) a.restore_from = from;
      }
      monitor = std::make_unique<RestartMonitor>(
          Env("CKPT_RESTART_DIR"), a.generation, std::chrono::milliseconds(10),
          stdout);
      std::printf("generation %llu: rank %u of %u, in-process restart on\n",
                  static_cast<unsigned long long>(a.generation), a.plan.rank,
                  a.plan.world_size);
      std::fflush(stdout);  // a pipe: stamped by the launcher as it comes
    }
  }
  const std::atomic<bool>* stop =
      monitor != nullptr ? monitor->requested() : nullptr;
  std::unique_ptr<Trainer> trainer;
  for (;;) {
    options.rank = static_cast<int>(a.plan.rank);
    options.world_size = static_cast<int>(a.plan.world_size);
    CKPT_RETURN_IF_ERROR(ckpt::worker::ValidateTrainerOptions(options));
    dp.rank = options.rank;
    dp.world_size = options.world_size;
    dp.master_addr = a.plan.master_addr;
    dp.master_port = static_cast<int>(a.plan.master_port);
    dp.generation = a.generation;
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> comm,
                          DataParallel::Create(dp));
    DataParallel* link = comm.get();  // owned by comm, then by the trainer
    if (monitor != nullptr) monitor->Watch(link);
    absl::Status s = RunGeneration(options, a, comm, trainer, stop);
    if (monitor != nullptr) monitor->Watch(nullptr);
    ckpt::worker::Phase("gen_left", options.rank);
    if (s.ok()) break;
    if (monitor == nullptr) return s;
    if (!stop->load()) {
      // A peer's death broke a collective (the peer-lost note is written):
      // the launcher's next plan says how to go on.
      if (!link->broken()) return s;
      std::printf("rank %d: %s: waiting for the next plan\n", options.rank,
                  s.ToString().c_str());
      std::fflush(stdout);
    }
    const int64_t at = trainer != nullptr ? trainer->step() : 0;
    std::optional<int64_t> in_flight;
    if (trainer != nullptr) in_flight = trainer->LeaveGeneration();
    ckpt::worker::Phase("trainer_left", options.rank);
    comm.reset();
    ckpt::worker::Phase("comm_reset", options.rank);
    RestartPlan next = monitor->TakePlan();
    ckpt::worker::Phase("plan_taken", options.rank);
    std::printf(
        "generation %llu: rank %d left generation %llu at step %lld%s; %s\n",
        static_cast<unsigned long long>(next.generation), options.rank,
        static_cast<unsigned long long>(a.generation),
        static_cast<long long>(at),
        in_flight.has_value()
            ? absl::StrCat(" (a save of step ", *in_flight, " was in flight)")
                  .c_str()
            : "",
        Footprint().c_str());
    std::fflush(stdout);
    CKPT_RETURN_IF_ERROR(ckpt::JoinedRestart(next.generation));
    ckpt::worker::Phase("joined", options.rank);
    // Another rank or world size, or a fresh start: a new trainer.
    if (next.rank != a.plan.rank || next.world_size != a.plan.world_size ||
        !next.restore_step.has_value()) {
      trainer.reset();
    }
    a = FromPlan(next);
  }
  CKPT_ASSIGN_OR_RETURN(uint64_t digest, trainer->ParamsDigest());
  std::printf("done rank=%d step %lld params_digest=%016llx\n", options.rank,
              static_cast<long long>(trainer->step()),
              static_cast<unsigned long long>(digest));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // gloo sends with writev: a peer that dies mid-collective must be an
  // EPIPE the collective reports (then the peer-lost note and the wait for
  // the plan), not a SIGPIPE that kills this survivor without a word.
  std::signal(SIGPIPE, SIG_IGN);
  if (ckpt::PrintedVersion(argc, argv, "ckpt-worker", CKPT_VERSION)) return 0;
  CLI::App app(
      "ckpt-worker: trains an MLP language model, checkpointing through ckptd");
  TrainerOptions o;
  int64_t steps = -1;
  app.add_option("--steps", steps, "train until this many optimizer steps")
      ->required();
  app.add_option("--seed", o.seed, "initial weights and data");
  app.add_option("--ckpt-every", o.ckpt_every, "save every K steps (0: never)");
  app.add_option("--vocab", o.model.vocab);
  app.add_option("--dim", o.model.dim);
  app.add_option("--layers", o.model.layers);
  app.add_option("--seq", o.model.seq, "predictions per sequence");
  app.add_option("--batch", o.model.batch, "sequences per step");
  app.add_option("--offload-fraction", o.offload_fraction,
                 "share of optimizer chunks updated by the CPU");
  app.add_option("--lr", o.lr);
  app.add_option("--log-every", o.log_every,
                 "print the loss every N steps (0: never)");
  app.add_flag("--log-mono", o.log_mono,
               "end each step line with rank=R mono_ms=T (CLOCK_MONOTONIC "
               "in ms when the step finished), for recovery timings");
  app.add_option("--cpu-threads", o.cpu_threads, "threads of the CPU Adam");
  double connect_timeout_s = 60, collective_timeout_s = 30;
  app.add_option("--connect-timeout-s", connect_timeout_s,
                 "how long ranks wait for each other to join (WORLD_SIZE > 1)");
  app.add_option(
      "--collective-timeout-s", collective_timeout_s,
      "how long a gradient allreduce waits for a peer before failing");
  std::string fault_hang;
  app.add_option("--fault-hang", fault_hang,
                 "STEP:RANK: rank RANK blocks forever in step STEP while the "
                 "others wait for it in the allreduce, unless it restored a "
                 "checkpoint (hang detection tests)");
  std::string fault_slow;
  app.add_option("--fault-slow", fault_slow,
                 "RANK:FACTOR: rank RANK computes FACTOR (in [1, 100]) times "
                 "slower and reports it (straggler detection tests)");
  app.add_option("--slow-first-step-s", o.slow_first_step_s,
                 "the first step of each process sleeps this long before "
                 "its compute (warm-up stand-in; in [0, 3600])");
  app.add_option("--eval-every", o.eval_every,
                 "evaluate on held-out batches every N steps, declared to "
                 "the hang detector as a pause (0: never)");
  app.add_option("--eval-s", o.eval_s,
                 "how long each evaluation runs, in (0, 3600] seconds");
  app.add_flag("--zero1", o.zero1,
               "ZeRO-1: partition the optimizer state (fp32 master weights, "
               "Adam moments) over the data-parallel ranks; each rank saves "
               "its slice, and a restore at another world size reshards it");
  bool no_in_process_restart = false;
  app.add_flag("--no-in-process-restart", no_in_process_restart,
               "under a launcher that hands out restart plans "
               "($CKPT_RESTART_DIR): exit when a collective breaks and be "
               "started anew, instead of restarting in this process");
  CLI11_PARSE(app, argc, argv);
  o.steps = steps;
  if (!fault_slow.empty()) {
    std::vector<std::string> parts = absl::StrSplit(fault_slow, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &o.fault_slow_rank) ||
        !absl::SimpleAtod(parts[1], &o.fault_slow_factor) ||
        o.fault_slow_rank < 0 || !(o.fault_slow_factor >= 1) ||
        o.fault_slow_factor > 100) {
      std::fprintf(stderr,
                   "ckpt-worker: --fault-slow: \"%.40s\" is not RANK:FACTOR "
                   "(RANK >= 0, FACTOR in [1, 100])\n",
                   fault_slow.c_str());
      return 2;
    }
  }
  // The flags' own names in the refusal (ValidateTrainerOptions names the
  // option fields, for library callers).
  const std::pair<bool, const char*> refusals[] = {
      {!(o.slow_first_step_s >= 0 && o.slow_first_step_s <= 3600),
       "--slow-first-step-s: must be in [0, 3600]"},
      {o.eval_every < 0, "--eval-every: must not be negative"},
      {!(o.eval_s > 0 && o.eval_s <= 3600), "--eval-s: must be in (0, 3600]"},
  };
  for (const auto& [bad, why] : refusals) {
    if (bad) {
      std::fprintf(stderr, "ckpt-worker: %s\n", why);
      return 2;
    }
  }
  if (!fault_hang.empty()) {
    std::vector<std::string> parts = absl::StrSplit(fault_hang, ':');
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &o.fault_hang_step) ||
        !absl::SimpleAtoi(parts[1], &o.fault_hang_rank) ||
        o.fault_hang_step < 1 || o.fault_hang_rank < 0) {
      std::fprintf(stderr,
                   "ckpt-worker: --fault-hang: \"%.40s\" is not STEP:RANK "
                   "(STEP >= 1, RANK >= 0)\n",
                   fault_hang.c_str());
      return 2;
    }
  }
  DataParallelOptions dp;
  dp.connect_timeout =
      std::chrono::milliseconds(std::llround(connect_timeout_s * 1000));
  dp.collective_timeout =
      std::chrono::milliseconds(std::llround(collective_timeout_s * 1000));
  absl::Status s = Main(o, dp, !no_in_process_restart);
  if (!s.ok()) {
    const char* rank = Env("RANK");
    std::fprintf(stderr, "ckpt-worker rank=%s: %s\n",
                 rank != nullptr ? rank : "0", s.ToString().c_str());
    return 1;
  }
  return 0;
}
