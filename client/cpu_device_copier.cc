// The DeviceCopier of a libckpt built without CUDA: no device exists, host
// memory needs no registration, and a device tensor is refused naming the
// tensor (tensor_check.cc asks before any byte moves, so a batch never gets a
// copy; if one does, it is refused the same way).
#include "absl/strings/str_cat.h"
#include "client/device_copier.h"

namespace ckpt::client {
namespace {

absl::Status NoCuda(const std::string& what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ", but libckpt was built without CUDA"));
}

class CpuDeviceCopyBatch final : public DeviceCopyBatch {
 public:
  absl::Status EnqueueToHost(int device, void*, const void*,
                             uint64_t) override {
    return NoCuda(absl::StrCat("copy from cuda:", device));
  }
  absl::Status EnqueueToDevice(int device, void*, const void*,
                               uint64_t) override {
    return NoCuda(absl::StrCat("copy to cuda:", device));
  }
  absl::Status Wait() override { return absl::OkStatus(); }
};

class CpuDeviceCopier final : public DeviceCopier {
 public:
  int DeviceCount() const override { return 0; }
  absl::Status RegisterHost(void*, uint64_t) override {
    return absl::OkStatus();
  }
  absl::Status UnregisterHost(void*) override { return absl::OkStatus(); }
  absl::Status CheckDeviceTensor(const Tensor& t,
                                 const std::string& label) const override {
    return NoCuda(absl::StrCat(label, ": on ", t.device.ToString()));
  }
  std::unique_ptr<DeviceCopyBatch> NewBatch() override {
    return std::make_unique<CpuDeviceCopyBatch>();
  }
};

}  // namespace

std::unique_ptr<DeviceCopier> NewDeviceCopier() {
  return std::make_unique<CpuDeviceCopier>();
}

bool BuiltWithCuda() { return false; }

}  // namespace ckpt::client
