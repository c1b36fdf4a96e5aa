#include "ckpt/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

namespace {
struct DTypeInfo {
  DType dtype;
  size_t size;
  std::string_view name;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, 4, "float32"},   {DType::kFloat16, 2, "float16"},
    {DType::kBFloat16, 2, "bfloat16"}, {DType::kFloat64, 8, "float64"},
    {DType::kInt8, 1, "int8"},         {DType::kUInt8, 1, "uint8"},
    {DType::kInt16, 2, "int16"},       {DType::kInt32, 4, "int32"},
    {DType::kInt64, 8, "int64"},       {DType::kBool, 1, "bool"},
};
const DTypeInfo* Find(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return &i;
  return nullptr;
}
}  // namespace

size_t DTypeSize(DType dtype) {
  const DTypeInfo* i = Find(dtype);
  return i ? i->size : 0;
}

std::string_view DTypeName(DType dtype) {
  const DTypeInfo* i = Find(dtype);
  return i ? i->name : "invalid";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& i : kDTypes)
    if (i.name == name) return i.dtype;
  return std::nullopt;
}

bool IsValidDType(uint32_t raw) {
  return Find(static_cast<DType>(raw)) != nullptr;
}

std::string Device::ToString() const {
  return kind == Kind::kHost ? "cpu" : absl::StrCat("cuda:", index);
}

std::string TensorLayout::ToString() const {
  std::string s =
      absl::StrCat("offsets [", absl::StrJoin(offsets, ", "), "] of [",
                   absl::StrJoin(global_shape, ", "), "]");
  if (!global_name.empty()) absl::StrAppend(&s, " of \"", global_name, "\"");
  return s;
}

std::optional<uint64_t> Tensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > UINT64_MAX / static_cast<uint64_t>(d))
      return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

std::optional<uint64_t> Tensor::bytes() const {
  auto n = numel();
  size_t es = DTypeSize(dtype);
  if (!n || es == 0 || *n > UINT64_MAX / es) return std::nullopt;
  return *n * es;
}

}  // namespace ckpt
