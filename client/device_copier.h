// DeviceCopier: every copy between accelerator memory and host memory that
// libckpt makes, behind one interface, so no other client file knows whether
// CUDA was built in. NewDeviceCopier() is defined twice and chosen at link
// time (client/CMakeLists.txt): cuda_device_copier.cc when CKPT_HAVE_CUDA
// (the CUDA runtime, one non-blocking stream per device per batch), else
// cpu_device_copier.cc (no device: every device tensor is refused, naming
// it, before any byte moves).
//
// A DeviceCopier is shared by the Client's threads and is thread-safe. A
// DeviceCopyBatch is one operation's copies (one save, one restore, one
// chunk of a file restore): copies are enqueued, run asynchronously, and
// Wait() blocks until every one has finished. A batch is not thread-safe and
// must be waited for (its destructor does so) before the host memory it
// reads or writes is reused.
#ifndef CKPT_CLIENT_DEVICE_COPIER_H_
#define CKPT_CLIENT_DEVICE_COPIER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "ckpt/tensor.h"

namespace ckpt::client {

class DeviceCopyBatch {
 public:
  virtual ~DeviceCopyBatch() = default;  // Waits for copies in flight.

  // Enqueues a copy of `bytes` from device memory of `device` to host memory
  // (chunked, asynchronous); the bytes are there once Wait() returns OK.
  [[nodiscard]] virtual absl::Status EnqueueToHost(int device, void* host_dst,
                                                   const void* device_src,
                                                   uint64_t bytes) = 0;
  // Enqueues a copy from host memory to device memory of `device`.
  [[nodiscard]] virtual absl::Status EnqueueToDevice(int device,
                                                     void* device_dst,
                                                     const void* host_src,
                                                     uint64_t bytes) = 0;
  // Blocks until every copy enqueued since the last Wait() has finished;
  // the first error, naming the device.
  [[nodiscard]] virtual absl::Status Wait() = 0;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;

  // Devices the runtime sees; 0 without CUDA (or without a device).
  virtual int DeviceCount() const = 0;
  bool HasDevice() const { return DeviceCount() > 0; }

  // Page-locks [data, data+bytes) for fast DMA. Unpinned memory still works,
  // more slowly; without a device this does nothing.
  [[nodiscard]] virtual absl::Status RegisterHost(void* data,
                                                  uint64_t bytes) = 0;
  [[nodiscard]] virtual absl::Status UnregisterHost(void* data) = 0;

  // Checks that device tensor t can be copied: its data is memory of device
  // t.device.index. The error starts with `label` (the tensor's name).
  [[nodiscard]] virtual absl::Status CheckDeviceTensor(
      const Tensor& t, const std::string& label) const = 0;

  // A new batch of copies for one operation.
  virtual std::unique_ptr<DeviceCopyBatch> NewBatch() = 0;
};

// The implementation this library was linked with.
std::unique_ptr<DeviceCopier> NewDeviceCopier();
// True when libckpt was built with CUDA (device tensors can be accepted).
bool BuiltWithCuda();

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_DEVICE_COPIER_H_
