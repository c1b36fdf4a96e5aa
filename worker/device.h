// The accelerator as the chunked optimizer sees it: device memory with a byte
// capacity, host buffers suited to fast copies (pinned on a GPU), and three
// in-order queues (compute, download, upload) on which copies and the fused
// Adam kernel run asynchronously. Work on one queue runs in submission order;
// work on different queues may overlap. A DeviceEvent marks the point in a
// queue after everything submitted before it; Wait blocks the caller until
// that point is reached. Errors of asynchronous work surface at the next
// Wait/Synchronize on that queue. Implementations are safe for concurrent
// calls from several threads.
#ifndef CKPT_WORKER_DEVICE_H_
#define CKPT_WORKER_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/adam_math.h"
#include "worker/cpu_adam.h"

namespace ckpt::worker {

enum class Queue : int { kCompute = 0, kDownload = 1, kUpload = 2 };
inline constexpr int kNumQueues = 3;

class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  [[nodiscard]] virtual absl::Status Wait() = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual std::string name() const = 0;
  // Bytes of device memory Allocate may hand out in all, and in use now.
  virtual uint64_t capacity_bytes() const = 0;
  virtual uint64_t used_bytes() const = 0;

  // Device memory; ResourceExhausted naming `what` past the capacity.
  [[nodiscard]] virtual absl::StatusOr<void*> Allocate(
      size_t bytes, std::string_view what) = 0;
  virtual void Free(void* device_ptr) = 0;
  // Host memory the queues copy from and to at full speed.
  [[nodiscard]] virtual absl::StatusOr<void*> AllocateHost(
      size_t bytes, std::string_view what) = 0;
  virtual void FreeHost(void* host_ptr) = 0;

  [[nodiscard]] virtual absl::Status CopyToHostAsync(Queue q, void* host,
                                                     const void* device,
                                                     size_t bytes) = 0;
  [[nodiscard]] virtual absl::Status CopyToDeviceAsync(Queue q, void* device,
                                                       const void* host,
                                                       size_t bytes) = 0;
  // AdamW over a span whose pointers are all device memory (p_bf16 may be
  // null), in AdamElement's operation order.
  [[nodiscard]] virtual absl::Status AdamAsync(Queue q,
                                               const AdamStepScalars& s,
                                               const AdamSpan& device_span) = 0;

  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<DeviceEvent>> Record(
      Queue q) = 0;
  [[nodiscard]] virtual absl::Status Synchronize(Queue q) = 0;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_DEVICE_H_
