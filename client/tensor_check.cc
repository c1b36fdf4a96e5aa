#include "client/tensor_check.h"

#include <string_view>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::client {

std::string TensorLabel(std::span<const Tensor> tensors, size_t i) {
  return absl::StrCat("tensors[", i, "] (\"", tensors[i].name, "\")");
}

absl::Status ValidateTensors(std::span<const Tensor> tensors,
                             std::vector<uint64_t>* bytes) {
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: empty");
  bytes->resize(tensors.size());
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string field = absl::StrCat("tensors[", i, "].name");
    if (absl::Status s = ValidateTensorName(t.name, field); !s.ok()) return s;
    const std::string label = TensorLabel(tensors, i);
    if (!names.insert(t.name).second)
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": duplicate name"));
    if (!IsValidDType(static_cast<uint32_t>(t.dtype)))
      return absl::InvalidArgumentError(
          absl::StrCat(label, ".dtype: ", static_cast<uint32_t>(t.dtype),
                       " is not a known dtype"));
    if (t.shape.size() > kMaxTensorDims)
      return absl::InvalidArgumentError(
          absl::StrCat(label, ".shape: ", t.shape.size(),
                       " dimensions, at most ", kMaxTensorDims));
    std::optional<uint64_t> b = t.bytes();
    if (!b)
      return absl::InvalidArgumentError(absl::StrCat(
          label, ".shape: a dimension is negative or the size overflows"));
    if (*b > 0 && t.data == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat(label, ".data: null for a tensor of ", *b, " bytes"));
    if (t.device.kind == Device::Kind::kCuda) {
      if (t.device.index < 0)
        return absl::InvalidArgumentError(absl::StrCat(
            label, ".device: cuda index ", t.device.index, " is negative"));
      if (!BuiltWithCuda())
        return absl::FailedPreconditionError(
            absl::StrCat(label, ": on ", t.device.ToString(),
                         ", but libckpt was built without CUDA"));
    } else if (t.device.kind != Device::Kind::kHost) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ".device: kind ", static_cast<uint32_t>(t.device.kind),
          " is not host or cuda"));
    }
    if (t.layout) {
      // Only what the RPC cannot carry is refused here; the daemon checks
      // the layout against the shape (storage::ValidateTensorLayout).
      for (const auto& [what, dims] :
           {std::pair{"global_shape", &t.layout->global_shape},
            std::pair{"offsets", &t.layout->offsets}}) {
        if (dims->size() > kMaxTensorDims)
          return absl::InvalidArgumentError(
              absl::StrCat(label, ".layout.", what, ": ", dims->size(),
                           " dimensions, at most ", kMaxTensorDims));
        for (size_t d = 0; d < dims->size(); ++d)
          if ((*dims)[d] < 0)
            return absl::InvalidArgumentError(
                absl::StrCat(label, ".layout.", what, "[", d, "]: ", (*dims)[d],
                             " is negative"));
      }
    }
    (*bytes)[i] = *b;
  }
  return absl::OkStatus();
}

absl::Status ValidateTensorsAndDevices(std::span<const Tensor> tensors,
                                       const DeviceCopier& devices,
                                       std::vector<uint64_t>* bytes) {
  CKPT_RETURN_IF_ERROR(ValidateTensors(tensors, bytes));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].device.is_host()) continue;
    CKPT_RETURN_IF_ERROR(
        devices.CheckDeviceTensor(tensors[i], TensorLabel(tensors, i)));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::client
