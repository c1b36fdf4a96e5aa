// The DeviceCopier of a libckpt built with CUDA (CKPT_HAVE_CUDA; see
// device_copier.h). Copies are enqueued as cudaMemcpyAsync pieces on one
// dedicated non-blocking stream per device per batch, so they never
// serialise behind the trainer's default-stream work; Wait() records an event
// on every stream used since the last Wait() and blocks on it. Every CUDA
// call goes through one macro that names the call in the Status and clears
// the (non-sticky) error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/device_copier.h"

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
      (void)cudaGetLastError(); /* the reset */   \
      return CudaToStatus(_ckpt_cuda_err, #call); \
    }                                             \
  } while (0)

namespace {

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: nothing to restore, not an error
      saved_ = -1;
    }
  }
  ~DeviceGuard() {
    // A destructor cannot report; clear the error so later calls succeed.
    if (saved_ >= 0 && cudaSetDevice(saved_) != cudaSuccess)
      (void)cudaGetLastError();
  }

 private:
  int saved_ = -1;
};

class CudaDeviceCopyBatch final : public DeviceCopyBatch {
 public:
  CudaDeviceCopyBatch() = default;
  ~CudaDeviceCopyBatch() override;  // Waits, destroys streams and events.
  CudaDeviceCopyBatch(const CudaDeviceCopyBatch&) = delete;
  CudaDeviceCopyBatch& operator=(const CudaDeviceCopyBatch&) = delete;

  absl::Status EnqueueToHost(int device, void* host_dst, const void* device_src,
                             uint64_t bytes) override;
  absl::Status EnqueueToDevice(int device, void* device_dst,
                               const void* host_src, uint64_t bytes) override;
  absl::Status Wait() override;

 private:
  struct PerDevice {
    int device = -1;
    void* stream = nullptr;  // cudaStream_t
    void* event = nullptr;   // cudaEvent_t
    bool pending = false;
  };
  absl::Status Enqueue(int device, void* dst, const void* src, uint64_t bytes,
                       bool to_host);
  absl::StatusOr<PerDevice*> ForDevice(int device);

  std::vector<PerDevice> devices_;
};

class CudaDeviceCopier final : public DeviceCopier {
 public:
  CudaDeviceCopier();
  int DeviceCount() const override { return device_count_; }
  absl::Status RegisterHost(void* data, uint64_t bytes) override;
  absl::Status UnregisterHost(void* data) override;
  absl::Status CheckDeviceTensor(const Tensor& t,
                                 const std::string& label) const override;
  std::unique_ptr<DeviceCopyBatch> NewBatch() override {
    return std::make_unique<CudaDeviceCopyBatch>();
  }

 private:
  int device_count_ = 0;
};

CudaDeviceCopier::CudaDeviceCopier() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: a CPU-only run
    count = 0;
  }
  device_count_ = count;
}

absl::Status CudaDeviceCopier::RegisterHost(void* data, uint64_t bytes) {
  if (device_count_ == 0) return absl::OkStatus();
  CKPT_CUDA_RETURN_IF_ERROR(
      cudaHostRegister(data, bytes, cudaHostRegisterPortable));
  return absl::OkStatus();
}

absl::Status CudaDeviceCopier::UnregisterHost(void* data) {
  if (device_count_ == 0) return absl::OkStatus();
  CKPT_CUDA_RETURN_IF_ERROR(cudaHostUnregister(data));
  return absl::OkStatus();
}

absl::Status CudaDeviceCopier::CheckDeviceTensor(
    const Tensor& t, const std::string& label) const {
  if (device_count_ == 0)
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": on ", t.device.ToString(),
                     ", but the CUDA runtime sees no device"));

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

// Teardown cannot report: every error is dropped and cleared, so a failed
// stream on one device does not keep the others' streams alive.
CudaDeviceCopyBatch::~CudaDeviceCopyBatch() {
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

absl::StatusOr<CudaDeviceCopyBatch::PerDevice*> CudaDeviceCopyBatch::ForDevice(
    int device) {
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
    // The event error is the one reported; the cleanup's is secondary.
    (void)cudaGetLastError();  // clears the sticky error the event left
    (void)cudaStreamDestroy(stream);
    return CudaToStatus(
        err, "cudaEventCreateWithFlags(&event, cudaEventDisableTiming)");
  }
  d.event = event;
  devices_.push_back(d);
  return &devices_.back();
}

absl::Status CudaDeviceCopyBatch::Enqueue(int device, void* dst,
                                          const void* src, uint64_t bytes,
                                          bool to_host) {
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

absl::Status CudaDeviceCopyBatch::EnqueueToHost(int device, void* host_dst,
                                                const void* device_src,
                                                uint64_t bytes) {
  return Enqueue(device, host_dst, device_src, bytes, /*to_host=*/true);
}

absl::Status CudaDeviceCopyBatch::EnqueueToDevice(int device, void* device_dst,
                                                  const void* host_src,
                                                  uint64_t bytes) {
  return Enqueue(device, device_dst, host_src, bytes, /*to_host=*/false);
}

absl::Status CudaDeviceCopyBatch::Wait() {
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

}  // namespace

std::unique_ptr<DeviceCopier> NewDeviceCopier() {
  return std::make_unique<CudaDeviceCopier>();
}

bool BuiltWithCuda() { return true; }

}  // namespace ckpt::client
