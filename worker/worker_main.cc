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
//   GLOO_SOCKET_IFNAME     bind gloo to this interface instead of the one
//                          that reaches MASTER_ADDR
//   CKPT_RESTORE_STEP      restore this step instead of the latest one
// Prints "step N loss X" lines and, last, "rank=R ... params_digest=<16 hex
// digits>".
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "util/program.h"
#include "util/status.h"
#include "worker/data_parallel.h"
#include "worker/trainer.h"

namespace {

using ckpt::worker::DataParallel;
using ckpt::worker::DataParallelOptions;
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

absl::Status Main(TrainerOptions options, DataParallelOptions dp) {
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
  options.rank = static_cast<int>(rank.value_or(0));
  options.world_size = static_cast<int>(world.value_or(1));
  CKPT_RETURN_IF_ERROR(ckpt::worker::ValidateTrainerOptions(options));
  if (local_rank.has_value() && *local_rank > options.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "$LOCAL_RANK = ", *local_rank, ": above $RANK = ", options.rank));
  }
  dp.rank = options.rank;
  dp.world_size = options.world_size;
  if (Env("MASTER_ADDR") != nullptr) dp.master_addr = Env("MASTER_ADDR");
  if (port.has_value()) dp.master_port = static_cast<int>(*port);
  if (Env("GLOO_SOCKET_IFNAME") != nullptr)
    dp.iface = Env("GLOO_SOCKET_IFNAME");
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> comm,
                        DataParallel::Connect(dp));

  std::unique_ptr<ckpt::Client> client;
  if (Env("CKPT_SOCKET") != nullptr) {
    ckpt::ClientOptions co;
    co.rank = options.rank;
    co.world_size = options.world_size;
    CKPT_ASSIGN_OR_RETURN(client, ckpt::Client::Connect(co));
  } else if (restore_step.has_value()) {
    return absl::InvalidArgumentError(
        "$CKPT_RESTORE_STEP is set but $CKPT_SOCKET is not");
  } else {
    std::printf("no $CKPT_SOCKET: training without checkpoints\n");
  }
  CKPT_ASSIGN_OR_RETURN(
      std::unique_ptr<Trainer> trainer,
      Trainer::Create(options, std::move(client), std::move(comm)));
  CKPT_ASSIGN_OR_RETURN(int64_t start, trainer->Restore(restore_step));
  if (start > 0)
    std::printf("restored step %lld\n", static_cast<long long>(start));
  std::fflush(stdout);
  CKPT_RETURN_IF_ERROR(trainer->Run(stdout));
  CKPT_ASSIGN_OR_RETURN(uint64_t digest, trainer->ParamsDigest());
  std::printf("done rank=%d step %lld params_digest=%016llx\n", options.rank,
              static_cast<long long>(trainer->step()),
              static_cast<unsigned long long>(digest));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
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
  absl::Status s = Main(o, dp);
  if (!s.ok()) {
    const char* rank = Env("RANK");
    std::fprintf(stderr, "ckpt-worker rank=%s: %s\n",
                 rank != nullptr ? rank : "0", s.ToString().c_str());
    return 1;
  }
  return 0;
}
