// Test helper: builds a complete, valid shard image (random tensor bytes,
// correct checksums) for the shard format and reader tests.
#ifndef CKPT_STORAGE_SHARD_TESTING_H_
#define CKPT_STORAGE_SHARD_TESTING_H_

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/shard_format.h"
#include "util/checksum.h"

namespace ckpt::storage {

// A complete shard image with random tensor bytes and correct checksums.
struct Shard {
  ShardInfo info;
  std::vector<char> image;
};

// place (may be null) sets the tensors' layouts before the offsets are
// computed: a shard with one is a version-2 shard.
inline Shard MakeShard(const std::vector<std::vector<uint64_t>>& shapes,
                       uint32_t seed = 1, void (*place)(ShardInfo&) = nullptr) {
  Shard s;
  s.info.job = "job-a";
  s.info.step = 42;
  s.info.rank = 1;
  s.info.world_size = 4;
  s.info.created_unix_ns = 123456789;
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ShardTensor t;
    t.name = "layer" + std::to_string(i) + ".weight";
    t.dtype = DType::kFloat32;
    t.shape = shapes[i];
    t.bytes = 4;
    for (uint64_t d : shapes[i]) t.bytes *= d;
    sizes.push_back(t.bytes);
    s.info.tensors.push_back(t);
  }
  if (place != nullptr) place(s.info);
  ShardLayout layout = *ComputeLayout(sizes, s.info.HasLayout());
  s.image.assign(layout.image_bytes, 0);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < s.info.tensors.size(); ++i) {
    ShardTensor& t = s.info.tensors[i];
    t.offset = layout.tensor_offsets[i];
    for (uint64_t b = 0; b < t.bytes; ++b)
      s.image[t.offset + b] = static_cast<char>(rng());
    t.checksum = TensorChecksum(s.image.data() + t.offset, t.bytes);
  }
  EXPECT_TRUE(EncodeShardMetadata(s.info, s.image).ok());
  return s;
}

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SHARD_TESTING_H_
