// storage::Backend: every byte ckptd persists or loads goes through this
// interface (in the spirit of leveldb's Env and RocksDB's FileSystem), so a
// fault-injection wrapper can stand in front of any backend in tests.
//
// Objects are named by keys that look like relative paths
// ("job/step-…/rank-00000.shard"). An object is written through an
// ObjectWriter and becomes visible under its key only when Commit() returns
// OK; after that it survives a crash (local disk: temp file, fsync, rename,
// fsync of the directory). A store without rename or fsync (S3) maps Commit
// to completing an upload; the daemon makes a step visible only through a
// manifest object written last, so nothing relies on rename atomicity
// across objects.
//
// Thread-safety: a Backend is safe for concurrent use; an ObjectWriter is
// used by one thread at a time.
#ifndef CKPT_STORAGE_BACKEND_H_
#define CKPT_STORAGE_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::storage {

class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;  // Aborts if not committed.
  // Queues a write of [data, data+len) at offset. Zero-copy: the bytes must
  // stay valid and unmodified until Commit() or Abort() returns. For direct
  // I/O, data, offset and len should be 4096-aligned; the backend falls back
  // to buffered I/O for a piece that is not.
  [[nodiscard]] virtual absl::Status WriteAt(uint64_t offset, const void* data,
                                             uint64_t len) = 0;
  // Waits for every queued write, makes the object durable and visible.
  [[nodiscard]] virtual absl::Status Commit() = 0;
  // Discards the object; nothing becomes visible.
  virtual void Abort() = 0;
};

struct BackendStats {
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t objects_committed = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "io_uring", "pwrite", "fault(io_uring)", ...
  virtual std::string name() const = 0;

  // Starts a new object of exactly `size` bytes.
  virtual absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size) = 0;
  // Writes a small object in one call (manifests). Durable on return.
  [[nodiscard]] virtual absl::Status PutSmallObject(std::string_view key,
                                                    std::string_view contents) = 0;

  // NotFound if the key does not exist.
  virtual absl::StatusOr<uint64_t> ObjectSize(std::string_view key) = 0;
  // Reads [offset, offset+len) of the object into dst, with several reads in
  // flight. A short object is DataLoss naming the key.
  [[nodiscard]] virtual absl::Status ReadAt(std::string_view key, uint64_t offset,
                                            void* dst, uint64_t len) = 0;
  // Every committed key that starts with prefix, sorted.
  virtual absl::StatusOr<std::vector<std::string>> List(std::string_view prefix) = 0;
  // Deletes one object (OK if absent).
  [[nodiscard]] virtual absl::Status Delete(std::string_view key) = 0;
  // Deletes every object under prefix, and (local disk) the emptied
  // directories.
  [[nodiscard]] virtual absl::Status DeletePrefix(std::string_view prefix) = 0;

  // Memory the backend may do I/O from or into without copying (io_uring
  // registered buffers). Optional: a backend may ignore it. The region must
  // stay mapped until UnregisterMemory.
  virtual absl::Status RegisterMemory(void* /*base*/, uint64_t /*len*/) { return absl::OkStatus(); }
  virtual void UnregisterMemory(void* /*base*/) {}

  virtual BackendStats stats() const = 0;
};

struct LocalBackendOptions {
  std::string root;            // created if missing
  bool use_io_uring = true;    // false (or no io_uring in the kernel): pwrite
  bool direct_io = true;       // O_DIRECT for aligned pieces
  unsigned queue_depth = 8;    // writes in flight per object
  uint64_t io_bytes = 4 << 20; // bytes per write/read request
  bool sync = true;            // fsync file and directory on commit
  // Remove "*.tmp.*" crash leftovers under root at open. Readers of a root
  // a live daemon writes to (ckptctl) must pass false.
  bool remove_tmp_files = true;
};

// Local disk. Commit: write "<key>.tmp.<nonce>", fsync, rename to key,
// fsync the directory. Keys ending in ".tmp.*" are never listed; a new
// backend on the same root removes leftovers of a crash.
absl::StatusOr<std::unique_ptr<Backend>> NewLocalBackend(LocalBackendOptions options);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_BACKEND_H_
