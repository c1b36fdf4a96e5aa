// Tensor descriptors shared by the client API, the shard format and the tools.
//
// A Tensor does not own its bytes: it names a buffer the caller owns (host
// memory or memory of one CUDA device) together with its element type and
// shape. All functions here are pure and thread-safe.
#ifndef CKPT_TENSOR_H_
#define CKPT_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt {

// Values are stored in shard files: never renumber.
enum class DType : uint32_t {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
};

// Bytes per element; 0 for a value that is not a known DType.
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", ...; "invalid" for an unknown value.
std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);
bool IsValidDType(uint32_t raw);

struct Device {
  enum class Kind : uint32_t { kHost = 0, kCuda = 1 };
  Kind kind = Kind::kHost;
  int index = 0;

  static Device Host() { return {}; }
  static Device Cuda(int index) { return {Kind::kCuda, index}; }
  bool is_host() const { return kind == Kind::kHost; }
  // "cpu" or "cuda:N".
  std::string ToString() const;
  friend bool operator==(const Device&, const Device&) = default;
};

struct Tensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  Device device;

  // Product of the shape (1 for a scalar); nullopt if a dimension is
  // negative or the product overflows.
  std::optional<uint64_t> numel() const;
  // numel() * DTypeSize(dtype); nullopt on overflow or an invalid dtype.
  std::optional<uint64_t> bytes() const;
};

// Most dimensions a tensor may have in a shard.
inline constexpr size_t kMaxTensorDims = 8;
// Longest tensor name, in bytes.
inline constexpr size_t kMaxTensorNameBytes = 159;

}  // namespace ckpt

#endif  // CKPT_TENSOR_H_
