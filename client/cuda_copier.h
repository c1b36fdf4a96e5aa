// CudaCopier: device<->host copies between CUDA tensors and a shm slot, and
// pinning of the slot memory. Built only with CUDA (CKPT_HAVE_CUDA).
//
// Copies are enqueued as cudaMemcpyAsync pieces on one dedicated
// non-blocking stream per device, so they never serialise behind the
// trainer's default-stream work; Wait() records an event on every stream used
// since the last Wait() and blocks on it. Every CUDA call goes through one
// macro that names the call in the Status and clears the (non-sticky) error.
// Thread-safety: not thread-safe; the Client uses one per operation thread.
#ifndef CKPT_CLIENT_CUDA_COPIER_H_
#define CKPT_CLIENT_CUDA_COPIER_H_

#ifdef CKPT_HAVE_CUDA

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt::client {

class CudaCopier {
 public:
  CudaCopier() = default;
  ~CudaCopier();  // Waits for copies in flight, destroys streams and events.
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;

  // True when the CUDA runtime sees at least one device.
  static bool DeviceAvailable();
  // Page-locks [data, data+bytes) for fast DMA (cudaHostRegisterPortable).
  static absl::Status Pin(void* data, uint64_t bytes);
  static absl::Status Unpin(void* data);

  // Checks that t.data is memory of device t.device.index; names the tensor.
  static absl::Status CheckDevicePointer(const Tensor& t,
                                         const std::string& label);

  absl::Status EnqueueToHost(int device, void* host_dst, const void* device_src,
                             uint64_t bytes);
  absl::Status EnqueueToDevice(int device, void* device_dst,
                               const void* host_src, uint64_t bytes);
  // Blocks until every enqueued copy has finished.
  absl::Status Wait();

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

}  // namespace ckpt::client

#endif  // CKPT_HAVE_CUDA
#endif  // CKPT_CLIENT_CUDA_COPIER_H_
