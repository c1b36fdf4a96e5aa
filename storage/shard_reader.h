// ShardReader: one shard object opened once through Backend::NewObjectReader;
// its header, index and footer are read and validated at Open, then tensors
// are read (into the caller's memory, or streamed through a buffer) and
// checked against their stored checksums by one chunk-hash loop
// (ChunkHasher, the chunk-wise checksum of util/checksum.h).
//
// Anything read is untrusted: a garbage, truncated or bit-flipped object
// yields DataLoss naming the key and the field or tensor, and no allocation
// exceeds the object's size. A ShardReader is used by one thread at a time
// and must not outlive its Backend. The free functions are thread-safe.
#ifndef CKPT_STORAGE_SHARD_READER_H_
#define CKPT_STORAGE_SHARD_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/backend.h"
#include "storage/shard_format.h"

namespace ckpt::storage {

// The chunk-wise tensor checksum, fed in order: every piece but the last a
// multiple of kChecksumChunk bytes. Finish() equals TensorChecksum of the
// concatenated pieces.
class ChunkHasher {
 public:
  void Add(const char* data, uint64_t len);
  uint64_t Finish() const;

 private:
  std::vector<uint64_t> chunk_hashes_;
};

// Called once per tensor, in index order, with the checksum computed over its
// bytes as read (compare with tensor.checksum).
using VerifyCallback =
    std::function<void(const ShardTensor& tensor, uint64_t computed)>;
// Receives a tensor's bytes in order, in pieces of at most kStreamBytes.
using PieceCallback =
    std::function<absl::Status(const char* data, uint64_t len)>;

class ShardReader {
 public:
  // A multiple of kChecksumChunk and of kShardAlign.
  static constexpr uint64_t kStreamBytes = 16ull << 20;

  // NotFound if the key is absent; DataLoss if the metadata is damaged.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardReader>> Open(
      Backend& backend, std::string_view key);

  const std::string& key() const { return key_; }
  const ShardInfo& info() const { return info_; }
  // The open object, for bytes outside tensors (header, index, footer).
  ObjectReader& object() { return *object_; }

  // Reads tensor i into dst (info().tensors[i].bytes bytes) with the
  // backend's queue depth, then checks its checksum: DataLoss naming the
  // tensor on a mismatch (dst then holds the damaged bytes).
  [[nodiscard]] absl::Status ReadTensor(size_t i, void* dst);
  // Streams tensor i through an aligned buffer to on_piece (may be empty)
  // and returns the checksum computed over the bytes read. on_piece's error
  // stops the stream and is returned.
  [[nodiscard]] absl::StatusOr<uint64_t> StreamTensor(
      size_t i, const PieceCallback& on_piece);
  // Streams every tensor and checks it. OK when all match; otherwise
  // DataLoss naming the first mismatching tensor ("<key>: tensor \"x\":
  // checksum mismatch (stored 0x.., computed 0x..)") and how many others
  // mismatched. on_tensor (may be empty) sees each tensor and its computed
  // checksum.
  [[nodiscard]] absl::Status Verify(const VerifyCallback& on_tensor = nullptr);

  // "<key>: tensor \"x\": checksum mismatch (stored 0x.., computed 0x..)".
  [[nodiscard]] absl::Status MismatchError(const ShardTensor& t,
                                           uint64_t computed) const;

 private:
  ShardReader(std::string key, std::unique_ptr<ObjectReader> object)
      : key_(std::move(key)), object_(std::move(object)) {}
  [[nodiscard]] absl::Status ReadMetadata();

  const std::string key_;
  std::unique_ptr<ObjectReader> object_;
  ShardInfo info_;
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, FreeDeleter>
      buffer_;  // kStreamBytes, allocated on first stream
};

// ShardReader::Open(...)->info().
[[nodiscard]] absl::StatusOr<ShardInfo> ReadShardInfo(Backend& backend,
                                                      std::string_view key);
// ShardReader::Open(...)->Verify(on_tensor).
[[nodiscard]] absl::Status VerifyShard(
    Backend& backend, std::string_view key,
    const VerifyCallback& on_tensor = nullptr);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_SHARD_READER_H_
