#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "worker/cuda_device.h"

namespace ckpt::worker {

namespace {

// The one conversion of CUDA errors; also clears the sticky last error.
absl::Status CudaStatus(cudaError_t err, std::string_view call,
                        std::string_view object) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  std::string msg =
      absl::StrCat(std::string(call), " (", std::string(object),
                   "): ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation)
    return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorInvalidValue) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

#define CKPT_CUDA_RETURN(call, object)                     \
  do {                                                     \
    absl::Status _s = CudaStatus((call), #call, (object)); \
    if (!_s.ok()) return _s;                               \
  } while (0)

__device__ __forceinline__ unsigned short ToBf16(float f) {
  unsigned int bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<unsigned short>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<unsigned short>(bits >> 16);
}

// AdamElement with every operation explicitly rounded (_rn intrinsics are
// never contracted into FMAs).
__global__ void AdamKernel(AdamStepScalars s, float* __restrict__ p,
                           const float* __restrict__ g, float* __restrict__ m,
                           float* __restrict__ v,
                           unsigned short* __restrict__ p_bf16, size_t n) {
  size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    float gi = g[i];
    float m1 =
        __fadd_rn(__fmul_rn(s.beta1, m[i]), __fmul_rn(s.one_minus_beta1, gi));
    float v1 = __fadd_rn(__fmul_rn(s.beta2, v[i]),
                         __fmul_rn(s.one_minus_beta2, __fmul_rn(gi, gi)));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v1), s.bias2_sqrt), s.eps);
    float pi = __fsub_rn(__fmul_rn(p[i], s.decay),
                         __fmul_rn(s.step_size, __fdiv_rn(m1, denom)));
    m[i] = m1;
    v[i] = v1;
    p[i] = pi;
    if (p_bf16 != nullptr) p_bf16[i] = ToBf16(pi);
  }
}

class CudaEvent final : public DeviceEvent {
 public:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  ~CudaEvent() override { cudaEventDestroy(e_); }
  absl::Status Wait() override {
    return CudaStatus(cudaEventSynchronize(e_), "cudaEventSynchronize",
                      "queue event");
  }

 private:
  cudaEvent_t e_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, uint64_t capacity)
      : ordinal_(ordinal), capacity_(capacity) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    for (cudaStream_t st : streams_) {
      if (st != nullptr) cudaStreamDestroy(st);
    }
    for (auto& [ptr, size] : allocations_) cudaFree(ptr);
  }

  absl::Status Init() {
    CKPT_CUDA_RETURN(cudaSetDevice(ordinal_), name());
    for (cudaStream_t& st : streams_) {
      CKPT_CUDA_RETURN(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking),
                       name());
    }
    return absl::OkStatus();
  }

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }
  uint64_t capacity_bytes() const override { return capacity_; }
  uint64_t used_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

  absl::StatusOr<void*> Allocate(size_t bytes, std::string_view what) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > capacity_ - used_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          name(), ": allocating ", bytes, " bytes for ", std::string(what),
          " exceeds capacity (", used_, " of ", capacity_, " bytes in use)"));
    }
    void* p = nullptr;
    CKPT_CUDA_RETURN(cudaSetDevice(ordinal_), name());
    CKPT_CUDA_RETURN(cudaMalloc(&p, bytes), what);
    allocations_[p] = bytes;
    used_ += bytes;
    return p;
  }

  void Free(void* device_ptr) override {
    if (device_ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(device_ptr);
    if (it == allocations_.end()) return;
    used_ -= it->second;
    allocations_.erase(it);
    cudaFree(device_ptr);
  }

  absl::StatusOr<void*> AllocateHost(size_t bytes,
                                     std::string_view what) override {
    void* p = nullptr;
    CKPT_CUDA_RETURN(cudaMallocHost(&p, bytes), what);
    return p;
  }
  void FreeHost(void* host_ptr) override {
    if (host_ptr != nullptr) cudaFreeHost(host_ptr);
  }

  absl::Status CopyToHostAsync(Queue q, void* host, const void* device,
                               size_t bytes) override {
    CKPT_CUDA_RETURN(
        cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, Stream(q)),
        name());
    return absl::OkStatus();
  }
  absl::Status CopyToDeviceAsync(Queue q, void* device, const void* host,
                                 size_t bytes) override {
    CKPT_CUDA_RETURN(
        cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, Stream(q)),
        name());
    return absl::OkStatus();
  }
  absl::Status AdamAsync(Queue q, const AdamStepScalars& s,
                         const AdamSpan& d) override {
    if (d.n == 0) return absl::OkStatus();
    CKPT_CUDA_RETURN(cudaSetDevice(ordinal_), name());
    constexpr int kThreads = 256;
    size_t blocks = (d.n + kThreads - 1) / kThreads;
    int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
    AdamKernel<<<grid, kThreads, 0, Stream(q)>>>(s, d.p, d.g, d.m, d.v,
                                                 d.p_bf16, d.n);
    CKPT_CUDA_RETURN(cudaGetLastError(), "AdamKernel launch");
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<DeviceEvent>> Record(Queue q) override {
    cudaEvent_t e;
    CKPT_CUDA_RETURN(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                     name());
    std::unique_ptr<DeviceEvent> event(new CudaEvent(e));
    CKPT_CUDA_RETURN(cudaEventRecord(e, Stream(q)), name());
    return event;
  }
  absl::Status Synchronize(Queue q) override {
    CKPT_CUDA_RETURN(cudaStreamSynchronize(Stream(q)), name());
    return absl::OkStatus();
  }

 private:
  cudaStream_t Stream(Queue q) const { return streams_[static_cast<int>(q)]; }

  const int ordinal_;
  const uint64_t capacity_;
  std::array<cudaStream_t, kNumQueues> streams_{};
  mutable std::mutex mu_;
  uint64_t used_ = 0;                              // guarded by mu_
  std::unordered_map<void*, size_t> allocations_;  // guarded by mu_
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(
    int ordinal, uint64_t capacity_bytes) {
  int count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ordinal ", ordinal, ": only ", count, " CUDA devices present"));
  }
  std::string object = absl::StrCat("cuda:", ordinal);
  CKPT_CUDA_RETURN(cudaSetDevice(ordinal), object);
  size_t free_bytes = 0, total_bytes = 0;
  CKPT_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes), object);
  if (capacity_bytes == 0) capacity_bytes = free_bytes;
  if (capacity_bytes > free_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(object, ": capacity ", capacity_bytes,
                     " bytes exceeds free memory ", free_bytes));
  }
  auto device = std::make_unique<CudaDevice>(ordinal, capacity_bytes);
  absl::Status s = device->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace ckpt::worker
