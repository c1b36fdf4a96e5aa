// Restore straight from a local shard file (OpenRestore source "file"): the
// client reads the file itself, so no shared-memory arena is created and the
// bytes are touched once on their way to the tensors.
//
// FileRestorer::Restore is a two-stage pipeline. Two reader threads (one's
// requests in flight while the other waits for the tail of its chunk) read
// the file ranges that hold the requested tensors, in file order, into three
// reusable 4096-aligned bounce buffers of kBounceBytes (allocated and
// pre-faulted on first use, registered with the I/O backend and, when a CUDA
// device exists, page-locked; kept for later restores) through
// storage::LocalBackend::ReadAt (io_uring, O_DIRECT, several requests in
// flight; buffered where the file system refuses direct I/O). Meanwhile the
// CopyEngine copies the chunk read before out of its bounce buffer, one
// kChecksumChunk piece at a time (pieces start at the tensor's offset, so
// their hashes are the tensor's chunk hashes), hashing while it copies; a
// CUDA tensor's piece is sent by DMA and its bounce bytes only hashed. Every
// tensor's checksum is then verified. So restore time is about read time.
//
// Thread-safety: Restore() may be called from several threads; calls are
// serialised (they share the bounce buffers). The CopyEngine must outlive
// the FileRestorer.
#ifndef CKPT_CLIENT_FILE_RESTORE_H_
#define CKPT_CLIENT_FILE_RESTORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "ckpt/tensor.h"
#include "client/copy_engine.h"
#include "storage/backend.h"

namespace ckpt::client {

// Matches tensors to the index of resp by name and checks each one's dtype,
// shape and size (InvalidArgument / NotFound naming the tensor) and that its
// bytes lie inside the image (DataLoss). metas[i] is the entry of tensors[i].
absl::Status MatchIndex(const v1::OpenRestoreResponse& resp,
                        std::span<const Tensor> tensors,
                        std::vector<const v1::TensorMeta*>* metas);

// Whether the shard file at path can be read by this process: true if it
// opens and is a regular file of exactly image_bytes bytes; false if it
// cannot be opened for lack of permission or because it does not exist, or
// if its size differs (the caller then asks the daemon to load it instead).
// Any other failure is an error naming the path.
absl::StatusOr<bool> ShardFileUsable(const std::string& path,
                                     uint64_t image_bytes);

class FileRestorer {
 public:
  static constexpr int kBounceBuffers = 3;
  static constexpr uint64_t kBounceBytes = 32ull << 20;

  FileRestorer(CopyEngine* engine, bool cuda_device);
  ~FileRestorer();
  FileRestorer(const FileRestorer&) = delete;
  FileRestorer& operator=(const FileRestorer&) = delete;

  // Fills tensors[i] from the image bytes of metas[i] (see MatchIndex) in
  // the shard file at path (absolute) of image_bytes bytes, and verifies
  // their checksums: DataLoss naming the tensor on a mismatch, and naming
  // the path if the file cannot be read.
  absl::Status Restore(const std::string& path, uint64_t image_bytes,
                       std::span<const Tensor> tensors,
                       std::span<const v1::TensorMeta* const> metas);

 private:
  // One bounce buffer's worth of the file: [offset, offset+len) holds
  // pieces [first_piece, end_piece).
  struct Chunk {
    uint64_t offset = 0;
    uint64_t len = 0;
    size_t first_piece = 0, end_piece = 0;
    // Non-null: the chunk is read straight into this host memory (a 4 KiB-
    // aligned run of one tensor), and only hashed afterwards.
    char* direct = nullptr;
  };
  struct Piece {
    size_t tensor = 0;
    uint64_t offset = 0;  // in the file
    uint64_t bytes = 0;
    uint64_t dst_offset = 0;  // in the tensor
    size_t hash_index = 0;
  };

  absl::Status EnsureBuffersLocked();
  absl::Status EnsureBackendLocked(const std::string& dir);
  // Copies chunk c, now in buffer buf, into the tensors; fills hashes.
  absl::Status CopyChunk(const Chunk& c, const char* buf,
                         std::span<const Tensor> tensors);

  CopyEngine* const engine_;
  const bool cuda_device_;

  std::mutex mu_;  // serialises Restore; guards everything below
  char* buffers_ = nullptr;  // kBounceBuffers * kBounceBytes, one mapping
  bool pinned_ = false;
  std::unique_ptr<storage::Backend> backend_;
  std::string backend_root_;
  // Per-restore plan, kept to reuse capacity.
  std::vector<Piece> pieces_;
  std::vector<Chunk> chunks_;
  std::vector<uint64_t> hashes_;  // per piece, by Piece::hash_index
  std::vector<CopyRegion> regions_;
  std::vector<uint64_t> region_hashes_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_FILE_RESTORE_H_
