#include "bench/step_bench.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "tests/harness.h"
#include "util/status.h"
#include "worker/trainer.h"

namespace ckpt::worker {

namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

absl::StatusOr<StepTimes> MeasureStepTimes(const StepBenchOptions& o) {
  ckpt::testing::TempDir root, run;
  std::string prefix = ckpt::testing::UniqueShmPrefix();
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::testing::DaemonProcess> daemon,
                        ckpt::testing::DaemonProcess::Start(
                            root.path() + "/root", run.path(), prefix));
  struct Cleanup {
    std::string prefix;
    ~Cleanup() { ckpt::testing::UnlinkArenas(prefix); }
  } cleanup{prefix};

  TrainerOptions t;
  t.model = o.model;
  t.offload_fraction = o.offload_fraction;
  t.cpu_threads = o.cpu_threads;
  t.log_every = 0;
  const int warmup = 2;  // the first save also creates and faults in the arena
  t.steps = warmup + int64_t{o.blocks} * o.steps_per_block;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> plain,
                        Trainer::Create(t, nullptr));
  t.ckpt_every = 1;
  CKPT_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Connect(ckpt::testing::OptionsFor(*daemon, "bench", 0, 1)));
  Client* c = client.get();
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> saving,
                        Trainer::Create(t, std::move(client)));

  CKPT_RETURN_IF_ERROR(plain->RunUntil(warmup, nullptr));
  CKPT_RETURN_IF_ERROR(saving->RunUntil(warmup, nullptr));
  std::vector<double> plain_s, saving_s;
  for (int b = 1; b <= o.blocks; ++b) {
    int64_t until = warmup + int64_t{b} * o.steps_per_block;
    double t0 = Now();
    CKPT_RETURN_IF_ERROR(plain->RunUntil(until, nullptr));
    double t1 = Now();
    CKPT_RETURN_IF_ERROR(saving->RunUntil(until, nullptr));
    double t2 = Now();
    plain_s.push_back((t1 - t0) / o.steps_per_block);
    saving_s.push_back((t2 - t1) / o.steps_per_block);
  }
  StepTimes out;
  out.step_s_no_ckpt = Median(plain_s);
  out.step_s_ckpt_every_step = Median(saving_s);
  out.ckpt_bytes = c->last_save_stats().bytes;
  return out;
}

}  // namespace ckpt::worker
