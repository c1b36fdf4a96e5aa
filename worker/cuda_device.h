// A Device backed by one CUDA GPU: cudaMalloc'd memory (capped at a byte
// capacity), pinned host buffers, one non-blocking stream per queue, and a
// fused AdamW kernel that evaluates AdamElement's operation order with
// explicitly rounded intrinsics (no FMA contraction), so it matches the CPU
// kernels bit for bit. Every CUDA call is checked and its error names the call
// and the object. Only built when CKPT_HAVE_CUDA; thread-safe.
#ifndef CKPT_WORKER_CUDA_DEVICE_H_
#define CKPT_WORKER_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/device.h"

namespace ckpt::worker {

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int CudaDeviceCount();

// capacity_bytes 0 means the GPU's free memory at creation.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(
    int ordinal, uint64_t capacity_bytes);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_CUDA_DEVICE_H_
