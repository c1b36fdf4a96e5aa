// ckpt_optim_bench: the chunked offloaded AdamW against the machine's limits,
// measured in one run.
//   cpu_adam_s    multi-threaded SIMD Adam over N params (28 B/param: read p,
//   g,
//                 m, v; write p, m, v), against
//   roofline_s    a streaming loop over the same arrays with the same threads
//   and
//                 partitioning, doing no Adam arithmetic (the bandwidth limit);
//   scalar_adam_s the scalar kernel on the same threads (baseline);
//   hybrid_step_s one overlapped step with a fraction of the chunks offloaded,
//                 against max_stage_s, the slowest stage of the same step run
//                 stage after stage (serial_hybrid_step_s, the baseline).
// Each figure is the best of --iters runs after one warm-up run.
//   step_s_no_ckpt, step_s_ckpt_every_step  ckpt-worker's training step
//                 without checkpoints and with a SaveAsync every step into a
//                 real ckptd (step_bench.h; built when the test harness is).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/step_bench.h"
#include "util/status.h"
#include "worker/chunked_adam.h"
#include "worker/host_device.h"
#include "worker/test_util.h"
#ifdef CKPT_HAVE_CUDA
#include "util/program.h"
#include "worker/cuda_device.h"
#endif

namespace ckpt::worker {
namespace {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename Fn>
double Best(int iters, Fn fn) {
  fn();  // warm-up: page faults, caches, thread start
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    double t0 = Now();
    fn();
    best = std::min(best, Now() - t0);
  }
  return best;
}

// Adam's memory traffic with trivial arithmetic; clones per ISA like the
// kernels.
__attribute__((target_clones("avx512f", "avx2", "default"))) void Stream(
    float* __restrict p, const float* __restrict g, float* __restrict m,
    float* __restrict v, uint16_t* __restrict bf16, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    float pi = p[i] + gi;
    m[i] += gi;
    v[i] += gi;
    p[i] = pi;
  }
  if (bf16 != nullptr) {
    for (size_t i = 0; i < n; ++i) bf16[i] = static_cast<uint16_t>(i);
  }
}

struct Figures {
  double cpu_adam_s, roofline_s, scalar_adam_s, cpu_adam_bf16_s,
      roofline_bf16_s;
  double hybrid_step_s, serial_hybrid_step_s, max_stage_s;
  // Host-budget device only: every stage streams through the same DRAM, so the
  // step cannot beat (all bytes it moves) / (roofline bandwidth).
  double shared_bandwidth_limit_s = 0;
  StepTimings stages;
};

absl::Status Run(size_t n, int threads, int iters, size_t chunk_elems,
                 double fraction, Device* device, Figures& f) {
  std::vector<float> p = testing::RandomFloats(n, 1, -1, 1),
                     g = testing::RandomFloats(n, 2, -1, 1);
  std::vector<float> m(n), v(n);
  std::vector<uint16_t> bf16(n);
  CpuAdam pool(threads), scalar(threads, AdamKernelScalar);
  AdamStepScalars s = MakeStepScalars(AdamConfig{}, 1);
  AdamSpan no_bf16{p.data(), g.data(), m.data(), v.data(), nullptr, n};
  AdamSpan with_bf16 = no_bf16;
  with_bf16.p_bf16 = bf16.data();
  auto stream = [&](uint16_t* out) {
    pool.ParallelFor(n, [&](size_t b, size_t e) {
      Stream(p.data() + b, g.data() + b, m.data() + b, v.data() + b,
             out ? out + b : nullptr, e - b);
    });
  };
  f.roofline_s = Best(iters, [&] { stream(nullptr); });
  f.cpu_adam_s = Best(iters, [&] { pool.Update(s, no_bf16); });
  f.scalar_adam_s = Best(iters, [&] { scalar.Update(s, no_bf16); });
  f.roofline_bf16_s = Best(iters, [&] { stream(bf16.data()); });
  f.cpu_adam_bf16_s = Best(iters, [&] { pool.Update(s, with_bf16); });

  std::vector<TensorSpec> model;
  for (size_t left = n, i = 0; left > 0; ++i) {
    size_t t = std::min(
        left, chunk_elems / 2 + 1 + 997 * (i % 7));  // odd, uneven tensors
    model.push_back({"layer" + std::to_string(i), t});
    left -= t;
  }
  for (bool overlap : {true, false}) {
    ChunkedAdamOptions o;
    o.chunk_elems = chunk_elems;
    o.offload_fraction = fraction;
    o.cpu_threads = threads;
    o.overlap = overlap;
    absl::StatusOr<std::unique_ptr<ChunkedAdam>> opt =
        ChunkedAdam::Create(device, model, o);
    if (!opt.ok()) return opt.status();
    for (size_t t = 0; t < model.size(); ++t) {
      std::vector<float> grad =
          testing::RandomFloats(model[t].numel, 10 + t, -1, 1);
      CKPT_RETURN_IF_ERROR((*opt)->SetGradients(t, grad));
    }
    absl::Status status;
    StepTimings best_timings;
    double best = Best(iters, [&] {
      absl::Status st = (*opt)->Step();
      if (status.ok()) status = st;
      if (best_timings.total_s == 0 ||
          (*opt)->last_timings().total_s < best_timings.total_s) {
        best_timings = (*opt)->last_timings();
      }
    });
    CKPT_RETURN_IF_ERROR(status);
    if (overlap) {
      f.hybrid_step_s = best;
    } else {
      f.serial_hybrid_step_s = best;
      f.stages = best_timings;
      double offloaded = 0, resident = 0;
      for (size_t c = 0; c < (*opt)->layout().num_chunks(); ++c) {
        (c < (*opt)->resident_chunks() ? resident : offloaded) +=
            (*opt)->layout().chunk_used[c];
      }
      // Offloaded: memcpy down (read 4 + write 4), Adam (30), memcpy up (2 +
      // 2); resident: the device's Adam (30).
      double bytes = 42 * offloaded + 30 * resident;
      f.shared_bandwidth_limit_s = bytes / (28.0 * n / f.roofline_s);
      f.max_stage_s =
          std::max({best_timings.download_s, best_timings.cpu_adam_s,
                    best_timings.upload_s, best_timings.device_adam_s});
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ckpt::worker

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckpt_optim_bench", CKPT_VERSION))
    return 0;
  using namespace ckpt::worker;
  CLI::App app{"Chunked offloaded AdamW benchmark"};
  size_t n = size_t{1} << 24, chunk_elems = size_t{1} << 20;
  int threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int iters = 5;
  double fraction = 0.5;
  bool json = false, cuda = false;
  app.add_option("--params", n, "parameters")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 32));
  app.add_option("--chunk-elems", chunk_elems, "elements per chunk")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "CPU Adam threads")
      ->check(CLI::Range(1, 1024));
  app.add_option("--iters", iters, "timed runs per figure")
      ->check(CLI::Range(1, 1000));
  app.add_option("--offload-fraction", fraction, "share of chunks on the CPU")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--cuda", cuda, "use GPU 0 as the device (else host memory)");
  app.add_flag("--json", json,
               "print one JSON object on stdout (table on stderr)");
  bool skip_step = false;
  StepBenchOptions step_options;
  app.add_flag("--skip-step-bench", skip_step,
               "leave out the training-step figures");
  app.add_option("--step-blocks", step_options.blocks,
                 "timed blocks per configuration")
      ->check(CLI::Range(1, 1000));
  app.add_option("--step-vocab", step_options.model.vocab,
                 "step bench model vocab");
  app.add_option("--step-dim", step_options.model.dim, "step bench model dim");
  app.add_option("--step-layers", step_options.model.layers,
                 "step bench model layers");
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<Device> device;
  if (cuda) {
#ifdef CKPT_HAVE_CUDA
    auto made = MakeCudaDevice(0, 0);
    if (!made.ok()) {
      std::fprintf(stderr, "ckpt_optim_bench: %s\n",
                   std::string(made.status().message()).c_str());
      return 1;
    }
    device = *std::move(made);
#else
    std::fprintf(stderr, "ckpt_optim_bench: built without CUDA\n");
    return 1;
#endif
  } else {
    device = std::make_unique<HostBudgetDevice>(uint64_t{1} << 40);
  }
  Figures f{};
  absl::Status s =
      Run(n, threads, iters, chunk_elems, fraction, device.get(), f);
  if (!s.ok()) {
    std::fprintf(stderr, "ckpt_optim_bench: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  StepTimes st{};
#ifdef CKPT_OPTIM_BENCH_STEP
  if (!skip_step) {
    absl::StatusOr<StepTimes> measured = MeasureStepTimes(step_options);
    if (!measured.ok()) {
      std::fprintf(stderr, "ckpt_optim_bench: step bench: %s\n",
                   std::string(measured.status().message()).c_str());
      return 1;
    }
    st = *measured;
  }
#endif
  FILE* table = json ? stderr : stdout;
  double gb = 1e-9 * static_cast<double>(n);
  std::fprintf(
      table,
      "device %s, kernel %s, %zu params, %d threads, chunk %zu, offload %.2f\n",
      device->name().c_str(), BestAdamKernelName(), n, threads, chunk_elems,
      fraction);
  std::fprintf(table, "%-22s %10s %10s %12s\n", "figure", "seconds", "GB/s",
               "vs limit");
  auto row = [&](const char* name, double sec, double bytes_per_param,
                 double limit) {
    std::fprintf(table, "%-22s %10.4f %10.2f %11.2fx\n", name, sec,
                 bytes_per_param > 0 ? gb * bytes_per_param / sec : 0.0,
                 limit > 0 ? sec / limit : 0.0);
  };
  row("roofline (28 B/param)", f.roofline_s, 28, 0);
  row("cpu_adam", f.cpu_adam_s, 28, f.roofline_s);
  row("scalar_adam", f.scalar_adam_s, 28, f.roofline_s);
  row("roofline (30 B, bf16)", f.roofline_bf16_s, 30, 0);
  row("cpu_adam (+bf16 out)", f.cpu_adam_bf16_s, 30, f.roofline_bf16_s);
  row("stage download", f.stages.download_s, 0, 0);
  row("stage cpu_adam", f.stages.cpu_adam_s, 0, 0);
  row("stage upload", f.stages.upload_s, 0, 0);
  row("stage device_adam", f.stages.device_adam_s, 0, 0);
  row("serial_hybrid_step", f.serial_hybrid_step_s, 0, f.max_stage_s);
  row("hybrid_step", f.hybrid_step_s, 0, f.max_stage_s);
  if (!cuda)
    row("hybrid vs shared DRAM", f.hybrid_step_s, 0,
        f.shared_bandwidth_limit_s);
  std::fprintf(table,
               "cpu_adam reaches %.0f%% of roofline; hybrid step is %.2fx its "
               "slowest stage\n",
               100 * f.roofline_s / f.cpu_adam_s,
               f.hybrid_step_s / f.max_stage_s);
  if (st.step_s_no_ckpt > 0) {
    const MlpConfig& m = step_options.model;
    std::fprintf(
        table,
        "training step (vocab %d, dim %d, layers %d, %d x %d tokens), %.1f MiB "
        "checkpoint:\n",
        m.vocab, m.dim, m.layers, m.batch, m.seq,
        static_cast<double>(st.ckpt_bytes) / (1 << 20));
    row("step_no_ckpt", st.step_s_no_ckpt, 0, 0);
    row("step_ckpt_every_step", st.step_s_ckpt_every_step, 0,
        st.step_s_no_ckpt);
    std::fprintf(table,
                 "throughput with a checkpoint every step: %.1f%% of without "
                 "(target >= 97%%)\n",
                 100 * st.step_s_no_ckpt / st.step_s_ckpt_every_step);
  }
  if (json) {
    std::printf(
        "{\"params\": %zu, \"threads\": %d, \"kernel\": \"%s\", \"device\": "
        "\"%s\", "
        "\"cpu_adam_s\": %.6f, \"roofline_s\": %.6f, \"scalar_adam_s\": %.6f, "
        "\"cpu_adam_bf16_s\": %.6f, \"roofline_bf16_s\": %.6f, "
        "\"hybrid_step_s\": %.6f, "
        "\"max_stage_s\": %.6f, \"serial_hybrid_step_s\": %.6f, "
        "\"shared_bandwidth_limit_s\": %.6f, "
        "\"step_s_no_ckpt\": %.6f, \"step_s_ckpt_every_step\": %.6f, "
        "\"ckpt_bytes\": %llu}\n",
        n, threads, BestAdamKernelName(), device->name().c_str(), f.cpu_adam_s,
        f.roofline_s, f.scalar_adam_s, f.cpu_adam_bf16_s, f.roofline_bf16_s,
        f.hybrid_step_s, f.max_stage_s, f.serial_hybrid_step_s,
        cuda ? 0.0 : f.shared_bandwidth_limit_s, st.step_s_no_ckpt,
        st.step_s_ckpt_every_step,
        static_cast<unsigned long long>(st.ckpt_bytes));
  }
  return 0;
}
