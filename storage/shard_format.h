// The shard file: one self-describing file per (job, step, rank).
//
//   [0, 4096)                  ShardHeader (packed, little-endian)
//   [4096, ...)                IndexEntry[num_tensors], 256 bytes each
//   version 2 only:            LayoutEntry[num_tensors], 296 bytes each
//   [..., data_offset)         zero bytes
//   [data_offset, ...)         tensor bytes, each tensor at a 4 KiB offset
//   [footer_offset, +4096)     ShardFooter
//
// The layout is canonical: ComputeLayout() derives every offset from the
// tensor sizes, so a shard image in a shared-memory slot is byte for byte
// the file, and persisting it is one sequential write. doc/shard-format.md
// documents the format; bump kShardVersion on any change.
// All functions are pure and thread-safe.
#ifndef CKPT_STORAGE_SHARD_FORMAT_H_
#define CKPT_STORAGE_SHARD_FORMAT_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/tensor.h"
#include "storage/keys.h"  // the keys moved there; kept for old includers

namespace ckpt::storage {

inline constexpr uint64_t kShardAlign = 4096;
// A shard whose tensors carry no layout is written as version 1 (readable
// by every build); one where a tensor has a layout (doc/resharding.md) as
// version 2, which adds a LayoutEntry per tensor after the index.
inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint32_t kShardVersionLayout = 2;
inline constexpr uint32_t kMaxShardTensors = 1u << 16;
inline constexpr char kShardMagic[8] = {'C', 'K', 'P', 'T', 'S', 'H', 'R', 'D'};
inline constexpr char kFooterMagic[8] = {'C', 'K', 'P', 'T',
                                         'E', 'N', 'D', '1'};

#pragma pack(push, 1)
struct ShardHeader {
  char magic[8];          // kShardMagic
  uint32_t version;       // kShardVersion
  uint32_t header_bytes;  // sizeof(ShardHeader)
  uint64_t step;
  uint32_t rank;
  uint32_t world_size;
  uint32_t num_tensors;
  uint32_t index_entry_bytes;  // sizeof(IndexEntry)
  uint64_t index_offset;       // 4096
  uint64_t data_offset;
  uint64_t footer_offset;
  uint64_t image_bytes;           // file size: footer_offset + 4096
  uint64_t checksum_chunk_bytes;  // kChecksumChunk when written
  uint64_t index_checksum;        // Hash64 of the index entries
  uint64_t created_unix_ns;
  char job[128];             // NUL-padded
  uint64_t header_checksum;  // Hash64 of every byte above
};
struct IndexEntry {
  char name[160];     // NUL-padded, at most 159 bytes
  uint32_t dtype;     // ckpt::DType
  uint32_t ndim;      // <= kMaxTensorDims
  uint64_t shape[8];  // unused dims are 0
  uint64_t offset;
  uint64_t bytes;
  uint64_t checksum;  // util/checksum.h TensorChecksum
};
struct ShardFooter {
  char magic[8];  // kFooterMagic
  uint64_t step;
  uint32_t rank;
  uint32_t num_tensors;
  uint64_t image_bytes;
  uint64_t index_checksum;   // same as the header's
  uint64_t footer_checksum;  // Hash64 of every byte above
};
// Version 2: where each tensor sits in its global tensor, in index order.
struct LayoutEntry {
  char global_name[160];      // NUL-padded; empty: the tensor's own name
  uint32_t has_layout;        // 0: a whole tensor (every other field 0), or 1
  uint32_t reserved;          // 0
  uint64_t global_shape[8];   // dims past the tensor's ndim are 0
  uint64_t piece_offsets[8];  // dims past the tensor's ndim are 0
};
#pragma pack(pop)
static_assert(sizeof(IndexEntry) == 256);
static_assert(sizeof(LayoutEntry) == 296);
static_assert(sizeof(ShardHeader) <= kShardAlign);

struct ShardLayout {
  uint32_t version = kShardVersion;  // kShardVersionLayout with layouts
  uint64_t index_offset = kShardAlign;
  uint64_t data_offset = 0;
  uint64_t footer_offset = 0;
  uint64_t image_bytes = 0;
  std::vector<uint64_t> tensor_offsets;
};

// Offsets for tensors of the given byte sizes, in order; with_layout: a
// version-2 shard (a LayoutEntry per tensor after the index moves the data
// further). Fails (InvalidArgument) past kMaxShardTensors or on overflow.
[[nodiscard]] absl::StatusOr<ShardLayout> ComputeLayout(
    std::span<const uint64_t> tensor_bytes, bool with_layout = false);

struct ShardTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  // Where the tensor sits in a global tensor (doc/resharding.md). Empty
  // global_shape: a whole tensor, and piece_offsets and global_name are
  // empty too; else both have as many dims as shape.
  std::vector<uint64_t> global_shape;
  std::vector<uint64_t> piece_offsets;
  std::string global_name;  // empty: the tensor's own name
};

struct ShardInfo {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint64_t created_unix_ns = 0;
  std::vector<ShardTensor> tensors;
  ShardLayout layout;  // filled by Decode / Validate

  // A tensor carries a layout: the shard is written as version 2.
  bool HasLayout() const;
};

// Checks a tensor index against the canonical layout: every name valid and
// unique, dtype known, ndim <= kMaxTensorDims, bytes == numel * dtype size,
// offsets == ComputeLayout(...); a layout's global_shape and piece_offsets
// as many dims as shape, each piece within its global shape, global_name
// valid (and both only with a global_shape). On success fills info->layout. The
// error (InvalidArgument) names the tensor and the field, e.g. "tensors[3]
// (\"layer1.w\").offset: 8192, expected 12288".
[[nodiscard]] absl::Status ValidateShardInfo(ShardInfo* info);

// Writes header + index into image[0, data_offset) and the footer into
// image[footer_offset, image_bytes). image.size() must be >= image_bytes.
// Validates first.
[[nodiscard]] absl::Status EncodeShardMetadata(ShardInfo info,
                                               std::span<char> image);

// Parses the header at the start of a shard: checks magic, version, sizes
// and header checksum. Needs the first kShardAlign bytes.
[[nodiscard]] absl::StatusOr<ShardHeader> DecodeHeader(
    std::span<const char> first_block);

// Parses and validates a shard's metadata from its full head (the first
// header.data_offset bytes) and its footer block (kShardAlign bytes at
// header.footer_offset). file_bytes is the file's actual size: a truncated
// file is DataLoss naming the expected and actual size.
[[nodiscard]] absl::StatusOr<ShardInfo> DecodeShardMetadata(
    std::span<const char> head, std::span<const char> footer_block,
    uint64_t file_bytes);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SHARD_FORMAT_H_
