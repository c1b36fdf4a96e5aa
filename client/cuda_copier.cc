#include "client/cuda_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt::client {

namespace {

// Piece size of one cudaMemcpyAsync: big enough to reach full PCIe/NVLink
// bandwidth, small enough that the host can interleave other work.
constexpr uint64_t kCudaPiece = 64ull << 20;

absl::Status CudaToStatus(cudaError_t err, const char* call) {
  std::string msg = absl::StrCat(call, ": ", cudaGetErrorName(err), ": ",
                                 cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidDevicePointer:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace

// Returns a Status naming the call when it fails; cudaGetLastError() resets
// the per-thread error so the next call does not see this one.
#define CKPT_CUDA_RETURN_IF_ERROR(call)           \
  do {                                            \
    cudaError_t _ckpt_cuda_err = (call);          \
    if (_ckpt_cuda_err != cudaSuccess) {          \
      (void)cudaGetLastError();                   \
      return CudaToStatus(_ckpt_cuda_err, #call); \
    }                                             \
  } while (0)

namespace {

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      (void)cudaGetLastError();
      saved_ = -1;
    }
  }
  ~DeviceGuard() {
    if (saved_ >= 0 && cudaSetDevice(saved_) != cudaSuccess)
      (void)cudaGetLastError();
  }

 private:
  int saved_ = -1;
};

}  // namespace

bool CudaCopier::DeviceAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

absl::Status CudaCopier::Pin(void* data, uint64_t bytes) {
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaHostRegister(data, bytes, cudaHostRegisterPortable));
  return absl::OkStatus();
}

absl::Status CudaCopier::Unpin(void* data) {
  CKPT_CUDA_RETURN_IF_ERROR(cudaHostUnregister(data));
  return absl::OkStatus();
}

absl::Status CudaCopier::CheckDevicePointer(const Tensor& t,
                                            const std::string& label) {
  if (t.data == nullptr) return absl::OkStatus();
  cudaPointerAttributes attr{};
  absl::Status s = [&]() -> absl::Status {
    CKPT_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, t.data));
    return absl::OkStatus();
  }();
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat(label, ".data: ", s.message()));
  bool on_device =
      attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  if (!on_device || attr.device != t.device.index)
    return absl::InvalidArgumentError(absl::StrCat(
        label, ".data: not memory of ", t.device.ToString(),
        on_device ? absl::StrCat(" (it belongs to cuda:", attr.device, ")")
                  : " (host memory)"));
  return absl::OkStatus();
}

CudaCopier::~CudaCopier() {
  DeviceGuard guard;
  for (PerDevice& d : devices_) {
    if (cudaSetDevice(d.device) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (d.stream != nullptr) {
      (void)cudaStreamSynchronize(static_cast<cudaStream_t>(d.stream));
      (void)cudaStreamDestroy(static_cast<cudaStream_t>(d.stream));
    }
    if (d.event != nullptr)
      (void)cudaEventDestroy(static_cast<cudaEvent_t>(d.event));
    (void)cudaGetLastError();
  }
}

absl::StatusOr<CudaCopier::PerDevice*> CudaCopier::ForDevice(int device) {
  for (PerDevice& d : devices_)
    if (d.device == device) return &d;
  CKPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  PerDevice d;
  d.device = device;
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  d.stream = stream;
  cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaStreamDestroy(stream);
    return CudaToStatus(
        err, "cudaEventCreateWithFlags(&event, cudaEventDisableTiming)");
  }
  d.event = event;
  devices_.push_back(d);
  return &devices_.back();
}

absl::Status CudaCopier::Enqueue(int device, void* dst, const void* src,
                                 uint64_t bytes, bool to_host) {
  if (bytes == 0) return absl::OkStatus();
  DeviceGuard guard;
  auto d = ForDevice(device);
  if (!d.ok()) return d.status();
  CKPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  auto stream = static_cast<cudaStream_t>((*d)->stream);
  auto kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (uint64_t off = 0; off < bytes; off += kCudaPiece) {
    uint64_t n = std::min(kCudaPiece, bytes - off);
    CKPT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(static_cast<char*>(dst) + off,
                        static_cast<const char*>(src) + off, n, kind, stream));
  }
  (*d)->pending = true;
  return absl::OkStatus();
}

absl::Status CudaCopier::EnqueueToHost(int device, void* host_dst,
                                       const void* device_src, uint64_t bytes) {
  return Enqueue(device, host_dst, device_src, bytes, /*to_host=*/true);
}

absl::Status CudaCopier::EnqueueToDevice(int device, void* device_dst,
                                         const void* host_src, uint64_t bytes) {
  return Enqueue(device, device_dst, host_src, bytes, /*to_host=*/false);
}

absl::Status CudaCopier::Wait() {
  DeviceGuard guard;
  absl::Status first;
  for (PerDevice& d : devices_) {
    if (!d.pending) continue;
    d.pending = false;
    absl::Status s = [&]() -> absl::Status {
      CKPT_CUDA_RETURN_IF_ERROR(cudaSetDevice(d.device));
      auto event = static_cast<cudaEvent_t>(d.event);
      CKPT_CUDA_RETURN_IF_ERROR(
          cudaEventRecord(event, static_cast<cudaStream_t>(d.stream)));
      CKPT_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event));
      return absl::OkStatus();
    }();
    if (first.ok() && !s.ok())
      first = absl::Status(s.code(),
                           absl::StrCat("cuda:", d.device, ": ", s.message()));
  }
  return first;
}

}  // namespace ckpt::client
