#include "worker/host_device.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

namespace {

void* AlignedAlloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

int Index(Queue q) { return static_cast<int>(q); }

}  // namespace

class HostBudgetDevice::Event final : public DeviceEvent {
 public:
  Event(Worker* w, uint64_t ticket) : w_(w), ticket_(ticket) {}
  absl::Status Wait() override {
    std::unique_lock<std::mutex> lock(w_->mu);
    w_->cv.wait(lock, [&] { return w_->completed >= ticket_; });
    return absl::OkStatus();
  }

 private:
  Worker* w_;
  uint64_t ticket_;
};

HostBudgetDevice::HostBudgetDevice(uint64_t capacity_bytes)
    : capacity_(capacity_bytes) {
  for (Worker& w : workers_) w.thread = std::thread([this, &w] { Run(&w); });
}

HostBudgetDevice::~HostBudgetDevice() {
  for (Worker& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      w.stop = true;
    }
    w.cv.notify_all();
    w.thread.join();
  }
  for (auto& [ptr, size] : allocations_) std::free(ptr);
}

void HostBudgetDevice::Run(Worker* w) {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [&] { return w->stop || !w->work.empty(); });
      if (w->work.empty()) return;  // stop requested and drained
      fn = std::move(w->work.front());
      w->work.pop_front();
    }
    fn();
    {
      std::lock_guard<std::mutex> lock(w->mu);
      ++w->completed;
    }
    w->cv.notify_all();
  }
}

absl::Status HostBudgetDevice::Submit(Queue q, std::function<void()> fn) {
  if (Index(q) < 0 || Index(q) >= kNumQueues) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-budget device: no queue ", Index(q)));
  }
  Worker& w = workers_[Index(q)];
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.work.push_back(std::move(fn));
    ++w.submitted;
  }
  w.cv.notify_all();
  return absl::OkStatus();
}

uint64_t HostBudgetDevice::used_bytes() const {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  return used_;
}

absl::StatusOr<void*> HostBudgetDevice::Allocate(size_t bytes,
                                                 std::string_view what) {
  std::lock_guard<std::mutex> lock(alloc_mu_);
  if (bytes > capacity_ - used_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host-budget device: allocating ", bytes, " bytes for ",
                     std::string(what), " exceeds capacity (", used_, " of ",
                     capacity_, " bytes in use)"));
  }
  void* p = AlignedAlloc(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host-budget device: out of host memory for ", std::string(what)));
  }
  allocations_[p] = bytes;
  used_ += bytes;
  return p;
}

void HostBudgetDevice::Free(void* device_ptr) {
  if (device_ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto it = allocations_.find(device_ptr);
  if (it == allocations_.end()) return;
  used_ -= it->second;
  allocations_.erase(it);
  std::free(device_ptr);
}

absl::StatusOr<void*> HostBudgetDevice::AllocateHost(size_t bytes,
                                                     std::string_view what) {
  void* p = AlignedAlloc(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host-budget device: cannot allocate ", bytes,
                     " host bytes for ", std::string(what)));
  }
  return p;
}

void HostBudgetDevice::FreeHost(void* host_ptr) { std::free(host_ptr); }

absl::Status HostBudgetDevice::CopyToHostAsync(Queue q, void* host,
                                               const void* device,
                                               size_t bytes) {
  return Submit(q, [=] { std::memcpy(host, device, bytes); });
}

absl::Status HostBudgetDevice::CopyToDeviceAsync(Queue q, void* device,
                                                 const void* host,
                                                 size_t bytes) {
  return Submit(q, [=] { std::memcpy(device, host, bytes); });
}

absl::Status HostBudgetDevice::AdamAsync(Queue q, const AdamStepScalars& s,
                                         const AdamSpan& span) {
  return Submit(q, [s, span] { BestAdamKernel()(s, span); });
}

absl::StatusOr<std::unique_ptr<DeviceEvent>> HostBudgetDevice::Record(Queue q) {
  if (Index(q) < 0 || Index(q) >= kNumQueues) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-budget device: no queue ", Index(q)));
  }
  Worker& w = workers_[Index(q)];
  std::lock_guard<std::mutex> lock(w.mu);
  return std::unique_ptr<DeviceEvent>(new Event(&w, w.submitted));
}

absl::Status HostBudgetDevice::Synchronize(Queue q) {
  absl::StatusOr<std::unique_ptr<DeviceEvent>> e = Record(q);
  if (!e.ok()) return e.status();
  return (*e)->Wait();
}

}  // namespace ckpt::worker
