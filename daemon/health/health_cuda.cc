// The CUDA check (see health.h): every device enumerates, and device 0
// copies `bytes` from pinned host memory and back, verified. The runtime
// is loaded with dlopen, so ckptd itself needs no libcudart: the same
// binary (and the .deb) runs on a node without the CUDA runtime.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/health/health.h"

namespace ckpt::daemon {
namespace {

using Outcome = HealthCheckResult::Outcome;

// The runtime's entry points this check calls, from dlopen'd libcudart.
struct Cudart {
  decltype(&::cudaGetLastError) GetLastError = nullptr;
  decltype(&::cudaGetErrorName) GetErrorName = nullptr;
  decltype(&::cudaGetErrorString) GetErrorString = nullptr;
  decltype(&::cudaGetDeviceCount) GetDeviceCount = nullptr;
  decltype(&::cudaGetDeviceProperties) GetDeviceProperties = nullptr;
  decltype(&::cudaSetDevice) SetDevice = nullptr;
  decltype(&::cudaMallocHost) MallocHost = nullptr;
  decltype(&::cudaMalloc) Malloc = nullptr;
  decltype(&::cudaMemcpy) Memcpy = nullptr;
  decltype(&::cudaFree) Free = nullptr;
  decltype(&::cudaFreeHost) FreeHost = nullptr;
};

// Loads the runtime this tree was built against (libcudart.so.<major>),
// else any libcudart.so; "" on success, else why not. Loaded once, never
// unloaded.
std::string LoadCudart(Cudart& rt) {
  const std::string versioned =
      absl::StrCat("libcudart.so.", CUDART_VERSION / 1000);
  void* h = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) h = dlopen("libcudart.so", RTLD_NOW | RTLD_LOCAL);
  if (!h) return absl::StrCat("no CUDA runtime (", versioned, ")");
  bool ok = true;
  auto sym = [&](auto& fn, const char* name) {
    fn =
        reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    ok = ok && fn != nullptr;
  };
  sym(rt.GetLastError, "cudaGetLastError");
  sym(rt.GetErrorName, "cudaGetErrorName");
  sym(rt.GetErrorString, "cudaGetErrorString");
  sym(rt.GetDeviceCount, "cudaGetDeviceCount");
  sym(rt.GetDeviceProperties, "cudaGetDeviceProperties");
  sym(rt.SetDevice, "cudaSetDevice");
  sym(rt.MallocHost, "cudaMallocHost");
  sym(rt.Malloc, "cudaMalloc");
  sym(rt.Memcpy, "cudaMemcpy");
  sym(rt.Free, "cudaFree");
  sym(rt.FreeHost, "cudaFreeHost");
  return ok ? "" : versioned + " lacks a runtime entry point";
}

// The CUDA call's name and error, with the sticky error cleared.
std::string CudaError(const Cudart& rt, const char* call, cudaError_t e) {
  (void)rt.GetLastError();
  return absl::StrCat(call, ": ", rt.GetErrorName(e), " (",
                      rt.GetErrorString(e), ")");
}

}  // namespace

HealthCheckResult CheckCuda(uint64_t bytes) {
  // No GPU on this machine (no driver's device node): nothing to check. A
  // machine with one whose driver or runtime fails is a failed check.
  const bool gpu_machine = access("/dev/nvidiactl", F_OK) == 0;
  static Cudart rt;
  static const std::string missing = LoadCudart(rt);
  if (!missing.empty())
    return {"cuda",
            gpu_machine ? Outcome::kFailed : Outcome::kSkipped,
            gpu_machine ? missing : "no GPU here (" + missing + ")",
            0,
            "",
            0};
  int count = 0;
  cudaError_t e = rt.GetDeviceCount(&count);
  if (!gpu_machine && (e != cudaSuccess || count == 0))
    return {"cuda",
            Outcome::kSkipped,
            e == cudaSuccess ? "no CUDA device"
                             : "no GPU here (" +
                                   CudaError(rt, "cudaGetDeviceCount", e) + ")",
            0,
            "",
            0};
  HealthCheckResult fail{"cuda", Outcome::kFailed, "", 0, "", 0};
  if (e != cudaSuccess || count == 0) {
    fail.reason = e != cudaSuccess ? CudaError(rt, "cudaGetDeviceCount", e)
                                   : "/dev/nvidiactl exists but no device "
                                     "enumerates";
    return fail;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop;
    if ((e = rt.GetDeviceProperties(&prop, d)) != cudaSuccess) {
      fail.reason = absl::StrCat("device ", d, ": ",
                                 CudaError(rt, "cudaGetDeviceProperties", e));
      return fail;
    }
  }
  void* host = nullptr;
  void* dev = nullptr;
  double best = 1e30;
  std::string error;
  if ((e = rt.SetDevice(0)) != cudaSuccess) {
    error = CudaError(rt, "cudaSetDevice", e);
  } else if ((e = rt.MallocHost(&host, bytes)) != cudaSuccess) {
    error = CudaError(rt, "cudaMallocHost", e);
  } else if ((e = rt.Malloc(&dev, bytes)) != cudaSuccess) {
    error = CudaError(rt, "cudaMalloc", e);
  } else {
    using Clock = std::chrono::steady_clock;
    auto secs = [](Clock::time_point t) {
      return std::chrono::duration<double>(Clock::now() - t).count();
    };
    for (int round = 0; round < 4 && error.empty(); ++round) {
      std::memset(host, 0x5a, bytes);
      auto t = Clock::now();
      e = rt.Memcpy(dev, host, bytes, cudaMemcpyHostToDevice);
      double s = secs(t);
      if (e != cudaSuccess) {
        error = CudaError(rt, "cudaMemcpy H2D", e);
        break;
      }
      std::memset(host, 0, bytes);  // so the D2H copy must bring it back
      t = Clock::now();
      e = rt.Memcpy(host, dev, bytes, cudaMemcpyDeviceToHost);
      s += secs(t);
      if (e != cudaSuccess) error = CudaError(rt, "cudaMemcpy D2H", e);
      best = std::min(best, s);
    }
    const auto* p = static_cast<const unsigned char*>(host);
    if (error.empty() && (p[0] != 0x5a || p[bytes - 1] != 0x5a))
      error = "D2H copy does not match H2D";
  }
  if (dev) (void)rt.Free(dev);
  if (host) (void)rt.FreeHost(host);
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
