// Restore straight from a local shard file (OpenRestore source FILE, which
// the daemon answers only when this process can read the file): the client
// reads the file itself, so no shared-memory arena is created and the bytes
// are touched once on their way to the tensors.
//
// FileRestorer::Restore is a two-stage pipeline. One reader thread keeps the
// raw read's queue of requests in flight (storage's IoQueue: io_uring,
// 8 x 4 MiB, O_DIRECT; its ring is kept for later restores) over the file
// ranges that hold the requested tensors, in file order. A host tensor at a 4
// KiB-aligned address is read straight into its own memory; other ranges go
// through three reusable 4096-aligned bounce buffers of kBounceBytes (allocated
// and pre-faulted on first need, page-locked when a device exists, kept for
// later restores; ReadSpans has three of kSpanBounceBytes). Meanwhile the
// caller's thread takes each chunk as its last request completes and, on the
// CopyEngine, hashes it one kChecksumChunk piece at a time (pieces start at the
// tensor's offset, so their hashes are the tensor's chunk hashes), copying
// bounce bytes to host tensors while hashing; a device tensor's piece goes by
// DMA (DeviceCopier) and its bounce bytes are only hashed. Every tensor's
// checksum is then verified: one pass, restore time is about read time.
//
// ReadSpans runs the same pipeline over spans of a shard file that a
// restore into another layout touches (doc/resharding.md): each span (one
// checksum chunk of a saved piece) is read, hashed, and copied to its own
// host destination if it has one (straight into it by O_DIRECT when
// aligned), and a callback copies other parts of it elsewhere while it is
// still in memory.
//
// Thread-safety: Restore() and ReadSpans() may be called from several
// threads; calls are serialised (they share the bounce buffers). The CopyEngine
// and the DeviceCopier must outlive the FileRestorer.
#ifndef CKPT_CLIENT_FILE_RESTORE_H_
#define CKPT_CLIENT_FILE_RESTORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "ckpt/tensor.h"
#include "client/copy_engine.h"
#include "client/device_copier.h"
#include "storage/io_queue.h"
#include "storage/ring_pool.h"

namespace ckpt::client {

// Matches tensors to the index of resp by name and checks each one's dtype,
// shape and size (InvalidArgument / NotFound naming the tensor) and that its
// bytes lie inside the image (DataLoss). A tensor given with a layout must
// have been saved with the same one, and one given without a layout whose
// saved entry is a piece of another shape is asked whole: both are
// FailedPrecondition naming both places, which Client::Impl::Restore
// serves as a restore into another layout. metas[i] is the entry of
// tensors[i].
[[nodiscard]] absl::Status MatchIndex(
    const v1::OpenRestoreResponse& resp, std::span<const Tensor> tensors,
    std::vector<const v1::TensorMeta*>* metas);

// The layout a saved tensor carries; nullopt when it was saved whole.
std::optional<TensorLayout> SavedLayout(const v1::TensorMeta& meta);

class FileRestorer {
 public:
  static constexpr int kBounceBuffers = 3;
  static constexpr uint64_t kBounceBytes = 32ull << 20;
  // ReadSpans' bounce buffers: it reads most spans straight into their
  // destination, so only a few chunks per run end go through them, and a
  // first read maps (and faults in) 12 MiB, not 96.
  static constexpr uint64_t kSpanBounceBytes = 4ull << 20;
  // The raw read's settings (bench/raw_io.h RawIoOptions).
  static constexpr unsigned kReadDepth = 8;
  static constexpr uint64_t kReadIoBytes = 4 << 20;

  FileRestorer(CopyEngine* engine, DeviceCopier* devices);
  ~FileRestorer();
  FileRestorer(const FileRestorer&) = delete;
  FileRestorer& operator=(const FileRestorer&) = delete;

  // Fills tensors[i] from the image bytes of metas[i] (see MatchIndex) in
  // the shard file at path (absolute) of image_bytes bytes, and verifies
  // their checksums: DataLoss naming the tensor on a mismatch. A file that
  // cannot be opened or read, or is not of image_bytes bytes, is an error
  // naming the path (no fallback: the daemon said this process can read it).
  [[nodiscard]] absl::Status Restore(
      const std::string& path, uint64_t image_bytes,
      std::span<const Tensor> tensors,
      std::span<const v1::TensorMeta* const> metas);

  // One range of a shard file to read and hash: `bytes` (1 to
  // kChecksumChunk) at file `offset`, copied to `dst` (host memory) as it
  // is hashed, or only hashed (dst null).
  struct Span {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    char* dst = nullptr;
  };
  // Called for span i once its bytes are at `at` (and in its dst), before
  // that memory is reused: copies parts of it elsewhere, or enqueues device
  // copies from it on dma (waited for before the memory is reused). An
  // error stops the read and is returned.
  using Landed =
      std::function<absl::Status(size_t i, const char* at, DeviceCopyBatch*)>;
  // Reads spans (non-overlapping, any order) of the shard file at path
  // (absolute) of image_bytes bytes, with reads in flight, hashing each as
  // it lands: hashes[i] is the XXH3 of span i (spans.size() entries). A
  // span past image_bytes is InvalidArgument; a file that cannot be opened
  // or read, or is not of image_bytes bytes, an error naming the path
  // (DataLoss for a short or truncated file).
  [[nodiscard]] absl::Status ReadSpans(const std::string& path,
                                       uint64_t image_bytes,
                                       std::span<const Span> spans,
                                       std::span<uint64_t> hashes,
                                       const Landed& landed);

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
    uint64_t left = 0;  // bytes still to be read (reader thread only)
  };
  struct Piece {
    uint64_t offset = 0;  // in the file
    uint64_t bytes = 0;
    char* dst = nullptr;        // host memory it is copied to while hashed
    size_t tensor = kNoTensor;  // Restore: a device tensor's index
    uint64_t dst_offset = 0;    // in that tensor
    size_t hash_index = 0;
  };
  static constexpr size_t kNoTensor = SIZE_MAX;

  // The chunks' shared progress between the reader and the caller.
  struct Progress;
  // The shard file, opened buffered and (where allowed) with O_DIRECT.
  struct File;

  [[nodiscard]] absl::Status EnsureBuffersLocked();
  void PlanLocked(uint64_t image_bytes, std::span<const Tensor> tensors,
                  std::span<const v1::TensorMeta* const> metas,
                  std::vector<size_t>* first_hash);
  // Groups pieces_ (in file order) into chunks_.
  void GroupLocked(uint64_t image_bytes);
  // Opens the file and runs the pipeline over chunks_, filling hashes_.
  [[nodiscard]] absl::Status ReadLocked(const std::string& path,
                                        uint64_t image_bytes,
                                        std::span<const Tensor> tensors,
                                        const Landed* landed);
  char* ChunkMemory(size_t c) const;
  // Reads every chunk of f through q, in order, each once Progress lets it.
  void ReadLoop(const File& f, storage::IoQueue* q, Progress* p);
  // Copies chunk c, now in buffer buf, into the tensors; fills hashes.
  [[nodiscard]] absl::Status CopyChunk(const Chunk& c, const char* buf,
                                       std::span<const Tensor> tensors,
                                       DeviceCopyBatch* dma,
                                       const Landed* landed);

  CopyEngine* const engine_;
  DeviceCopier* const devices_;
  storage::RingPool rings_{kReadDepth, 1};

  std::mutex mu_;  // serialises Restore; guards everything below
  // Bounce buffers: kBounceBuffers of `each` bytes, one mapping each.
  struct Bounce {
    uint64_t each = 0;
    char* memory = nullptr;
    bool pinned = false;
  };
  Bounce whole_{kBounceBytes};      // Restore's
  Bounce spans_{kSpanBounceBytes};  // ReadSpans'
  Bounce* bounce_ = &whole_;        // the current call's
  // Per-restore plan, kept to reuse capacity.
  std::vector<Piece> pieces_;
  std::vector<Chunk> chunks_;
  std::vector<uint64_t> hashes_;  // per piece, by Piece::hash_index
  std::vector<CopyRegion> regions_;
  std::vector<uint64_t> region_hashes_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_FILE_RESTORE_H_
