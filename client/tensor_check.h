// Validation of caller-supplied tensors before any byte moves. Pure and
// thread-safe.
#ifndef CKPT_CLIENT_TENSOR_CHECK_H_
#define CKPT_CLIENT_TENSOR_CHECK_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ckpt/tensor.h"
#include "client/device_copier.h"

namespace ckpt::client {

// "tensors[3] (\"layer1.w\")": how errors name a tensor.
std::string TensorLabel(std::span<const Tensor> tensors, size_t i);

// Checks every tensor: name valid and unique, dtype known, at most
// kMaxTensorDims dimensions, bytes() defined, data non-null when it has
// bytes, device host or cuda:N (cuda only when built with CUDA). Fills
// bytes[i]. InvalidArgument (FailedPrecondition for CUDA without CUDA)
// naming the tensor.
[[nodiscard]] absl::Status ValidateTensors(std::span<const Tensor> tensors,
                                           std::vector<uint64_t>* bytes);

// ValidateTensors, then: a CUDA tensor needs a device the runtime sees and
// a pointer that belongs to its device (devices.CheckDeviceTensor).
[[nodiscard]] absl::Status ValidateTensorsAndDevices(
    std::span<const Tensor> tensors, const DeviceCopier& devices,
    std::vector<uint64_t>* bytes);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_TENSOR_CHECK_H_
