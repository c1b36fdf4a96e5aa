// The CUDA check (see health.h): every device enumerates, and device 0
// copies `bytes` from pinned host memory and back, verified.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/health.h"

namespace ckpt::daemon {
namespace {

using Outcome = HealthCheckResult::Outcome;

// The CUDA call's name and error, with the sticky error cleared.
std::string CudaError(const char* call, cudaError_t e) {
  (void)cudaGetLastError();
  return absl::StrCat(call, ": ", cudaGetErrorName(e), " (",
                      cudaGetErrorString(e), ")");
}

}  // namespace

HealthCheckResult CheckCuda(uint64_t bytes) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  // No GPU on this machine (no driver's device node): nothing to check. A
  // machine with one whose driver or runtime fails is a failed check.
  const bool gpu_machine = access("/dev/nvidiactl", F_OK) == 0;
  if (!gpu_machine && (e != cudaSuccess || count == 0))
    return {"cuda",
            Outcome::kSkipped,
            e == cudaSuccess
                ? "no CUDA device"
                : "no GPU here (" + CudaError("cudaGetDeviceCount", e) + ")",
            0,
            "",
            0};
  HealthCheckResult fail{"cuda", Outcome::kFailed, "", 0, "", 0};
  if (e != cudaSuccess || count == 0) {
    fail.reason = e != cudaSuccess ? CudaError("cudaGetDeviceCount", e)
                                   : "/dev/nvidiactl exists but no device "
                                     "enumerates";
    return fail;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, d)) != cudaSuccess) {
      fail.reason = absl::StrCat("device ", d, ": ",
                                 CudaError("cudaGetDeviceProperties", e));
      return fail;
    }
  }
  void* host = nullptr;
  void* dev = nullptr;
  double best = 1e30;
  std::string error;
  if ((e = cudaSetDevice(0)) != cudaSuccess) {
    error = CudaError("cudaSetDevice", e);
  } else if ((e = cudaMallocHost(&host, bytes)) != cudaSuccess) {
    error = CudaError("cudaMallocHost", e);
  } else if ((e = cudaMalloc(&dev, bytes)) != cudaSuccess) {
    error = CudaError("cudaMalloc", e);
  } else {
    using Clock = std::chrono::steady_clock;
    auto secs = [](Clock::time_point t) {
      return std::chrono::duration<double>(Clock::now() - t).count();
    };
    for (int round = 0; round < 4 && error.empty(); ++round) {
      std::memset(host, 0x5a, bytes);
      auto t = Clock::now();
      e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
      double s = secs(t);
      if (e != cudaSuccess) {
        error = CudaError("cudaMemcpy H2D", e);
        break;
      }
      std::memset(host, 0, bytes);  // so the D2H copy must bring it back
      t = Clock::now();
      e = cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
      s += secs(t);
      if (e != cudaSuccess) error = CudaError("cudaMemcpy D2H", e);
      best = std::min(best, s);
    }
    const auto* p = static_cast<const unsigned char*>(host);
    if (error.empty() && (p[0] != 0x5a || p[bytes - 1] != 0x5a))
      error = "D2H copy does not match H2D";
  }
  if (dev) (void)cudaFree(dev);
  if (host) (void)cudaFreeHost(host);
  if (!error.empty()) {
    fail.reason = error;
    return fail;
  }
  // Two copies per round: H2D and D2H.
  return {"cuda",
          Outcome::kPassed,
          absl::StrCat(count, " device(s)"),
          best > 0 ? 2.0 * static_cast<double>(bytes) / best / 1e9 : 0,
          "GB/s",
          0};
}

}  // namespace ckpt::daemon
