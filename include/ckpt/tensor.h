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

// Where a tensor sits in a larger, global tensor (doc/resharding.md): the
// tensor is the box [offsets, offsets + shape) of a tensor of global_shape.
// A rank may save several pieces of one global tensor under their own
// names, each naming the global tensor in global_name; several ranks may
// save the same piece (replicas). global_shape and offsets have as many
// dims as the tensor's shape; each piece lies within global_shape. A
// scalar has no layout (an empty global_shape means none).
struct TensorLayout {
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
  std::string global_name;  // empty: the tensor's own name

  // "offsets [4, 0] of [8, 4]" (and " of \"w\"" when global_name is set).
  std::string ToString() const;
  friend bool operator==(const TensorLayout&, const TensorLayout&) = default;
};

struct Tensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  Device device;
  // Unset: the tensor is whole (a global tensor of its own), as before
  // layouts existed.
  std::optional<TensorLayout> layout = std::nullopt;

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
