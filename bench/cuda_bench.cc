// ckpt_cuda_bench: the GPU save and restore paths against the GPU's own
// limits, measured in the same run (doc/gpu.md):
//  - device -> shared memory Save of --sizes-gib GiB vs cudaMemcpy
//    device -> pinned host of the same bytes (target >= 0.90 of its speed);
//  - shared memory -> device Restore vs cudaMemcpy pinned -> device
//    (target <= 1.2x);
//  - the first save of a job (arena creation and cudaHostRegister) and the
//    cost of cudaHostRegister itself, default flags vs Portable;
//  - SaveAsync call -> return (target <= 10 ms);
//  - a training step of cuBLAS bf16 GEMMs with and without a SaveAsync of
//    --overlap-gib GiB overlapping it (target <= 3% slower).
// Each figure and its limit alternate --reps times; medians are reported.
// It starts its own ckptd (--retain 1) on a temporary root and stops it.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/daemon_process.h"
#include "bench/stats.h"
#include "ckpt.grpc.pb.h"
#include "ckpt/client.h"
#include "util/program.h"

namespace ckpt::bench {
namespace {

#define CHECK_CUDA(call)                                       \
  do {                                                         \
    cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) {                                   \
      std::fprintf(stderr, "ckpt_cuda_bench: %s: %s\n", #call, \
                   cudaGetErrorString(e_));                    \
      std::exit(1);                                            \
    }                                                          \
  } while (0)
#define CHECK_OK(expr)                                         \
  do {                                                         \
    absl::Status s_ = (expr);                                  \
    if (!s_.ok()) {                                            \
      std::fprintf(stderr, "ckpt_cuda_bench: %s: %s\n", #expr, \
                   std::string(s_.message()).c_str());         \
      std::exit(1);                                            \
    }                                                          \
  } while (0)

struct Options {
  std::vector<int> sizes_gib = {1, 4, 16};
  int tensors = 16;
  int reps = 3;
  double overlap_gib = 2;
  int gemm_n = 8192;
  int gemms_per_step = 40;
  int steps = 10;
  std::string root = "/var/tmp";
  bool json = false;
  bool overlap_only = false;
};

struct SizeFigures {
  int gib = 0;
  double first_save_s = 0, save_s = 0, d2h_s = 0, restore_s = 0, h2d_s = 0;
  double async_return_s = 0, async_copied_s = 0;
  bool restore_matches = false;
};

std::unique_ptr<Client> Connect(const std::string& socket,
                                const std::string& job) {
  ClientOptions o;
  o.socket_path = socket;
  o.job = job;
  o.rank = 0;
  o.world_size = 1;
  auto c = Client::Connect(o);
  CHECK_OK(c.status());
  return std::move(*c);
}

// Deletes the job and its arenas (each size's state goes before the next
// one's is made: a 16 GiB state takes 32 GiB of shared memory).
void DeleteJob(const std::string& socket, const std::string& job) {
  auto stub = v1::Ckptd::NewStub(grpc::CreateChannel(
      "unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::DeleteRequest req;
  req.set_job(job);
  req.set_all_steps(true);
  v1::DeleteResponse resp;
  grpc::Status s = stub->Delete(&ctx, req, &resp);
  if (!s.ok())
    std::fprintf(stderr, "ckpt_cuda_bench: delete %s: %s\n", job.c_str(),
                 s.error_message().c_str());
}

// Tensors that split `bytes` of device memory at `base` evenly.
std::vector<Tensor> Split(char* base, uint64_t bytes, int n) {
  std::vector<Tensor> t;
  uint64_t per = bytes / n;
  for (int i = 0; i < n; ++i)
    t.push_back(Tensor{"t" + std::to_string(i),
                       DType::kUInt8,
                       {static_cast<int64_t>(per)},
                       base + per * i,
                       Device::Cuda(0)});
  return t;
}

SizeFigures MeasureSize(const Options& o, const std::string& socket, int gib,
                        char* pinned) {
  SizeFigures f;
  f.gib = gib;
  const uint64_t bytes = uint64_t(gib) << 30;
  char* dev = nullptr;
  char* back = nullptr;
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  CHECK_CUDA(cudaMemset(dev, 0x3c, bytes));
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::string job = "cuda-" + std::to_string(gib) + "g";
  auto client = Connect(socket, job);
  std::vector<Tensor> t = Split(dev, bytes, o.tensors);
  int64_t step = 1;
  auto t0 = Clock::now();
  CHECK_OK(client->Save(step, t));
  f.first_save_s = Since(t0);
  CHECK_OK(client->WaitDurable(step));
  std::vector<double> save, d2h, restore, h2d, ret, copied;
  for (int r = 0; r < o.reps; ++r) {
    t0 = Clock::now();
    CHECK_CUDA(cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost));
    d2h.push_back(Since(t0));
    t0 = Clock::now();
    CHECK_OK(client->Save(++step, t));
    save.push_back(Since(t0));
    CHECK_OK(
        client->WaitDurable(step));  // untimed: the next save finds a free slot
    if (r == 0) {  // once per size: the training-step figures sample it more
      t0 = Clock::now();
      auto h = client->SaveAsync(++step, t);
      ret.push_back(Since(t0));
      CHECK_OK(h.status());
      CHECK_OK(h->WaitCopied());
      copied.push_back(Since(t0));
      CHECK_OK(h->Wait());
      CHECK_OK(client->WaitDurable(step));
    }
    t0 = Clock::now();
    CHECK_CUDA(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice));
    h2d.push_back(Since(t0));
    t0 = Clock::now();
    CHECK_OK(client->Restore(step, t));
    restore.push_back(Since(t0));
  }
  // The restored bytes: every byte still 0x3c (checked on a sample of pages).
  CHECK_CUDA(cudaMallocHost(&back, 1 << 20));
  f.restore_matches = true;
  for (uint64_t off = 0; off + (1 << 20) <= bytes; off += bytes / 8) {
    CHECK_CUDA(cudaMemcpy(back, dev + off, 1 << 20, cudaMemcpyDeviceToHost));
    for (int i = 0; i < (1 << 20); ++i) f.restore_matches &= back[i] == 0x3c;
  }
  CHECK_CUDA(cudaFreeHost(back));
  CHECK_CUDA(cudaFree(dev));
  client.reset();  // unmaps the arena
  DeleteJob(socket, job);
  f.save_s = Median(save);
  f.d2h_s = Median(d2h);
  f.restore_s = Median(restore);
  f.h2d_s = Median(h2d);
  f.async_return_s = Median(ret);
  f.async_copied_s = Median(copied);
  return f;
}

// cudaHostRegister of a fresh, populated shared mapping of `gib` GiB.
double RegisterCost(int gib, unsigned flags) {
  const uint64_t bytes = uint64_t(gib) << 30;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return -1;
  auto t0 = Clock::now();
  CHECK_CUDA(cudaHostRegister(p, bytes, flags));
  double s = Since(t0);
  CHECK_CUDA(cudaHostUnregister(p));
  munmap(p, bytes);
  return s;
}

struct OverlapFigures {
  double step_s = 0;               // the GEMMs alone
  double compute_with_save_s = 0;  // the GEMMs while the save's copy runs
  double step_with_save_s =
      0;  // ... and until WaitCopied (the optimizer may run)
  double ratio = 0, compute_ratio = 0, async_return_s = 0, copy_alone_s = 0;
};

// A training step: gemms_per_step bf16 GEMMs of n x n x n on one stream.
OverlapFigures MeasureOverlap(const Options& o, const std::string& socket) {
  OverlapFigures f;
  const size_t n = o.gemm_n;
  __nv_bfloat16 *a, *b, *c;
  CHECK_CUDA(cudaMalloc(&a, n * n * 2));
  CHECK_CUDA(cudaMalloc(&b, n * n * 2));
  CHECK_CUDA(cudaMalloc(&c, n * n * 2));
  CHECK_CUDA(cudaMemset(a, 0x11, n * n * 2));
  CHECK_CUDA(cudaMemset(b, 0x22, n * n * 2));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) std::exit(1);
  cublasSetStream(h, stream);
  float alpha = 1, beta = 0;
  auto step = [&] {
    for (int i = 0; i < o.gemms_per_step; ++i)
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF,
                   n, b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  };
  const uint64_t bytes = uint64_t(o.overlap_gib * (1ull << 30));
  char* state = nullptr;
  CHECK_CUDA(cudaMalloc(&state, bytes));
  CHECK_CUDA(cudaMemset(state, 0x5a, bytes));
  auto client = Connect(socket, "cuda-overlap");
  std::vector<Tensor> t = Split(state, bytes, o.tensors);
  int64_t s = 1;
  CHECK_OK(client->Save(s, t));  // the arena exists before the timed steps
  CHECK_OK(client->WaitDurable(s));
  step();  // warm-up
  std::vector<double> alone, compute, with, ret, copy;
  // Alone and with a save alternate in both orders, each after an untimed
  // step, so neither gets the GPU's clocks after an idle pause (the
  // persists between them) more often than the other.
  auto time_alone = [&] {
    step();
    auto t0 = Clock::now();
    step();
    alone.push_back(Since(t0));
  };
  auto time_with_save = [&] {
    step();
    auto t0 = Clock::now();
    auto hd = client->SaveAsync(++s, t);
    ret.push_back(Since(t0));
    CHECK_OK(hd.status());
    step();
    compute.push_back(Since(t0));
    CHECK_OK(hd->WaitCopied());
    with.push_back(Since(t0));
    CHECK_OK(hd->Wait());
    CHECK_OK(client->WaitDurable(s));  // untimed
  };
  for (int i = 0; i < o.steps; ++i) {
    if (i % 2 == 0) {
      time_alone();
      time_with_save();
    } else {
      time_with_save();
      time_alone();
    }
    auto t0 = Clock::now();
    auto hc = client->SaveAsync(++s, t);  // the copy with nothing beside it
    CHECK_OK(hc.status());
    CHECK_OK(hc->WaitCopied());
    copy.push_back(Since(t0));
    CHECK_OK(hc->Wait());
    CHECK_OK(client->WaitDurable(s));
  }
  f.step_s = Median(alone);
  f.compute_with_save_s = Median(compute);
  f.step_with_save_s = Median(with);
  f.ratio = f.step_with_save_s / f.step_s;
  f.compute_ratio = f.compute_with_save_s / f.step_s;
  f.async_return_s = Median(ret);
  f.copy_alone_s = Median(copy);
  cublasDestroy(h);
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));
  CHECK_CUDA(cudaFree(state));
  return f;
}

int Main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckpt_cuda_bench", CKPT_VERSION))
    return 0;
  Options o;
  CLI::App app{
      "ckpt_cuda_bench: GPU save/restore against cudaMemcpy in the same run"};
  app.add_option("--sizes-gib", o.sizes_gib, "state sizes in GiB")
      ->check(CLI::Range(1, 256));
  app.add_option("--tensors", o.tensors, "tensors per state")
      ->check(CLI::Range(1, 4096));
  app.add_option("--reps", o.reps, "alternations of each figure with its limit")
      ->check(CLI::Range(1, 100));
  app.add_option("--overlap-gib", o.overlap_gib,
                 "state saved during a training step")
      ->check(CLI::Range(0.0625, 256.0));
  app.add_option("--gemm-n", o.gemm_n, "GEMM size of the training step")
      ->check(CLI::Range(256, 32768));
  app.add_option("--gemms-per-step", o.gemms_per_step,
                 "GEMMs per training step")
      ->check(CLI::Range(1, 10000));
  app.add_option("--steps", o.steps, "timed training steps of each kind")
      ->check(CLI::Range(1, 1000));
  app.add_option("--root", o.root, "parent of the daemon's temporary root");
  app.add_flag("--json", o.json, "one JSON object on stdout");
  app.add_flag("--overlap-only", o.overlap_only,
               "only the training-step figures");
  CLI11_PARSE(app, argc, argv);

  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "ckpt_cuda_bench: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::string dir = o.root + "/ckpt_cuda_bench." + std::to_string(getpid());
  std::filesystem::create_directories(dir + "/root");
  DaemonConfig dc;
  dc.binary = DefaultCkptdPath();
  dc.socket = dir + "/ckptd.sock";
  dc.root = dir + "/root";
  dc.shm_prefix = "ckptcudabench" + std::to_string(getpid());
  dc.log_path = dir + "/ckptd.log";
  dc.extra_args = {"--retain", "1"};
  struct statfs fs {};
  // A root in memory (tmpfs) takes no O_DIRECT; it keeps persists, which
  // run between the timed figures, from taking most of the run.
  if (statfs(dir.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC)
    dc.extra_args.push_back("--no-direct-io");
  DaemonProcess daemon(dc);
  CHECK_OK(daemon.Start());

  double reg_default = RegisterCost(4, cudaHostRegisterDefault);
  double reg_portable = RegisterCost(4, cudaHostRegisterPortable);
  int max_gib = *std::max_element(o.sizes_gib.begin(), o.sizes_gib.end());
  char* pinned = nullptr;
  CHECK_CUDA(cudaMallocHost(&pinned, uint64_t(max_gib) << 30));
  std::vector<SizeFigures> sizes;
  for (int gib : o.sizes_gib) {
    if (o.overlap_only) break;
    sizes.push_back(MeasureSize(o, dc.socket, gib, pinned));
    const SizeFigures& f = sizes.back();
    std::fprintf(stderr,
                 "%3d GiB: save %.3f s (D2H limit %.3f s, %.2f of it) restore "
                 "%.3f s (H2D %.3f "
                 "s, %.2fx) first save %.3f s, SaveAsync return %.2f ms, "
                 "copied %.3f s, restore "
                 "bytes %s\n",
                 gib, f.save_s, f.d2h_s, f.d2h_s / f.save_s, f.restore_s,
                 f.h2d_s, f.restore_s / f.h2d_s, f.first_save_s,
                 f.async_return_s * 1e3, f.async_copied_s,
                 f.restore_matches ? "match" : "DIFFER");
  }
  CHECK_CUDA(cudaFreeHost(pinned));
  OverlapFigures ov = MeasureOverlap(o, dc.socket);
  std::fprintf(
      stderr,
      "cudaHostRegister of 4 GiB: default %.3f s (%.1f GB/s), Portable %.3f s\n"
      "training step (%d bf16 GEMMs of %d^3): %.4f s alone; with a SaveAsync "
      "of %.2f GiB "
      "overlapping: GEMMs done %.4f s (%.3fx), copy done %.4f s (%.3fx); the "
      "copy "
      "alone %.4f s; SaveAsync return %.2f ms\n",
      reg_default, 4 * 1.073741824 / reg_default, reg_portable,
      o.gemms_per_step, o.gemm_n, ov.step_s, o.overlap_gib,
      ov.compute_with_save_s, ov.compute_ratio, ov.step_with_save_s, ov.ratio,
      ov.copy_alone_s, ov.async_return_s * 1e3);
  CHECK_OK(daemon.Stop());
  std::filesystem::remove_all(dir);
  if (o.json) {
    std::printf(
        "{\"device\":\"%s\",\"register_4gib_default_s\":%.4f,\"register_4gib_"
        "portable_s\":%.4f,",
        prop.name, reg_default, reg_portable);
    std::printf("\"sizes\":[");
    for (size_t i = 0; i < sizes.size(); ++i) {
      const SizeFigures& f = sizes[i];
      std::printf(
          "%s{\"gib\":%d,\"first_save_s\":%.4f,\"save_s\":%.4f,\"d2h_limit_s\":"
          "%.4f,"
          "\"save_of_limit\":%.3f,\"restore_s\":%.4f,\"h2d_limit_s\":%.4f,"
          "\"restore_ratio\":%.3f,"
          "\"save_async_return_s\":%.5f,\"save_async_copied_s\":%.4f,\"restore_"
          "matches\":%s}",
          i ? "," : "", f.gib, f.first_save_s, f.save_s, f.d2h_s,
          f.d2h_s / f.save_s, f.restore_s, f.h2d_s, f.restore_s / f.h2d_s,
          f.async_return_s, f.async_copied_s,
          f.restore_matches ? "true" : "false");
    }
    std::printf(
        "],\"overlap\":{\"gib\":%.3f,\"gemms_per_step\":%d,\"step_s\":%.5f,"
        "\"compute_with_save_s\":%.5f,\"compute_ratio\":%.4f,\"step_with_save_"
        "s\":%.5f,"
        "\"ratio\":%.4f,\"copy_alone_s\":%.5f,\"save_async_return_s\":%.5f}}\n",
        o.overlap_gib, o.gemms_per_step, ov.step_s, ov.compute_with_save_s,
        ov.compute_ratio, ov.step_with_save_s, ov.ratio, ov.copy_alone_s,
        ov.async_return_s);
  }
  bool ok = true;
  for (const SizeFigures& f : sizes) ok &= f.restore_matches;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) { return ckpt::bench::Main(argc, argv); }
