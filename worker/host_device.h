// HostBudgetDevice: a Device whose "device memory" is host memory limited to a
// byte capacity, so the chunked optimizer's placement, pipelining and policies
// run (and are tested) on machines without a GPU. Each queue is one thread that
// runs its work in order, the way a GPU's copy engines and compute stream do:
// copies are memcpy, Adam is the best CPU kernel on one thread. Thread-safe.
#ifndef CKPT_WORKER_HOST_DEVICE_H_
#define CKPT_WORKER_HOST_DEVICE_H_

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "worker/device.h"

namespace ckpt::worker {

class HostBudgetDevice final : public Device {
 public:
  explicit HostBudgetDevice(uint64_t capacity_bytes);
  ~HostBudgetDevice() override;

  std::string name() const override { return "host-budget"; }
  uint64_t capacity_bytes() const override { return capacity_; }
  uint64_t used_bytes() const override;

  [[nodiscard]] absl::StatusOr<void*> Allocate(size_t bytes,
                                               std::string_view what) override;
  void Free(void* device_ptr) override;
  [[nodiscard]] absl::StatusOr<void*> AllocateHost(
      size_t bytes, std::string_view what) override;
  void FreeHost(void* host_ptr) override;

  [[nodiscard]] absl::Status CopyToHostAsync(Queue q, void* host,
                                             const void* device,
                                             size_t bytes) override;
  absl::Status CopyToDeviceAsync(Queue q, void* device, const void* host,
                                 size_t bytes) override;
  [[nodiscard]] absl::Status AdamAsync(Queue q, const AdamStepScalars& s,
                                       const AdamSpan& span) override;

  [[nodiscard]] absl::StatusOr<std::unique_ptr<DeviceEvent>> Record(
      Queue q) override;
  absl::Status Synchronize(Queue q) override;

 private:
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;  // guarded by mu
    uint64_t submitted = 0;                  // guarded by mu
    uint64_t completed = 0;                  // guarded by mu
    bool stop = false;                       // guarded by mu
    std::thread thread;
  };
  class Event;

  [[nodiscard]] absl::Status Submit(Queue q, std::function<void()> fn);
  void Run(Worker* w);

  const uint64_t capacity_;
  mutable std::mutex alloc_mu_;
  uint64_t used_ = 0;                              // guarded by alloc_mu_
  std::unordered_map<void*, size_t> allocations_;  // guarded by alloc_mu_
  std::array<Worker, kNumQueues> workers_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_HOST_DEVICE_H_
