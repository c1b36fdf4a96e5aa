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
// An object is read through an ObjectReader opened once (leveldb's
// RandomAccessFile): the open, the size and the file descriptors are paid
// once, not per read. BackendWrapper forwards every call to another Backend
// (RocksDB's FileSystemWrapper); a wrapper overrides only what it changes.
//
// Ownership: readers and writers must not outlive the Backend that made
// them. Thread-safety: a Backend is safe for concurrent use; an
// ObjectWriter or ObjectReader is used by one thread at a time.
#ifndef CKPT_STORAGE_BACKEND_H_
#define CKPT_STORAGE_BACKEND_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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

// How a new object is created.
struct WriterOptions {
  // Local disk: fchown the temp file before the rename, so the object
  // appears owned by it. A process that may not give files away (EPERM: not
  // root) leaves the object owned by itself; Stat() reports the real owner.
  // Stores without owners ignore it.
  std::optional<uid_t> owner_uid;
  // Local disk: permission bits (fchmod before the rename; default 0600).
  std::optional<mode_t> mode;
};

struct ObjectInfo {
  uint64_t size = 0;
  std::optional<uid_t> owner_uid;  // absent on stores without owners
  std::optional<mode_t> mode;  // permission bits; absent on stores without them
};

// One open object. Used by one thread at a time.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  // The object's size when it was opened.
  virtual uint64_t size() const = 0;
  // Reads [offset, offset+len) into dst, with several reads in flight (the
  // queue depth and request size of the backend's options). A range past
  // the object's end is DataLoss naming the key.
  [[nodiscard]] virtual absl::Status ReadAt(uint64_t offset, void* dst,
                                            uint64_t len) = 0;
  // Told that [offset, offset + len) of a ReadAtNotify's range is in place
  // (and stays so). Called from the reading threads, possibly several at
  // once; the time it takes delays only its own thread's next request.
  using Arrived = std::function<void(uint64_t offset, uint64_t len)>;
  // ReadAt that reports each piece of the range as it arrives, so that the
  // caller can work on the bytes that are in (e.g. checksum them) while the
  // rest is still on the wire. On OK every byte was reported exactly once.
  // The default reads the whole range, then reports it as one piece.
  [[nodiscard]] virtual absl::Status ReadAtNotify(uint64_t offset, void* dst,
                                                  uint64_t len,
                                                  const Arrived& arrived) {
    absl::Status s = ReadAt(offset, dst, len);
    if (s.ok()) arrived(offset, len);
    return s;
  }
  // dst is a shared mapping of this file at this offset (a shm arena's
  // slot in /dev/shm).
  struct DestFile {
    int fd = -1;
    uint64_t offset = 0;
  };
  // Shown the bytes of a ReadAtNotifyToFile's range as they come in,
  // before they are stored: [at, at + n) of the object, of the piece that
  // starts at `piece`, in order within the piece. A piece whose transfer
  // starts over (a retry) starts again at at == piece; what was shown of
  // it before is void. Called from the reading threads, one piece per
  // thread at a time; its time delays that thread's receive.
  using Received = std::function<void(uint64_t piece, uint64_t at,
                                      const char* data, size_t n)>;
  // ReadAtNotify into memory that maps `file`: a reader that can writes
  // the bytes into the file (pwrite) rather than storing them through
  // dst. A tmpfs page written so is filled without being zeroed first and
  // without a page fault in this process; one first stored through a
  // mapping costs both. The bytes then read through dst as usual.
  // `received` (may be empty) is shown the bytes as they come in by a
  // reader that can (the object store's); a caller must not count on it.
  // The default stores through dst and shows nothing.
  [[nodiscard]] virtual absl::Status ReadAtNotifyToFile(
      uint64_t offset, void* dst, uint64_t len, const DestFile& file,
      const Arrived& arrived, const Received& received) {
    (void)file;
    (void)received;
    return ReadAtNotify(offset, dst, len, arrived);
  }
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
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ObjectWriter>>
  NewObjectWriter(std::string_view key, uint64_t size,
                  const WriterOptions& options) = 0;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size) {
    return NewObjectWriter(key, size, WriterOptions{});
  }
  // Writes a small object in one call (manifests). Durable on return.
  [[nodiscard]] virtual absl::Status PutSmallObject(
      std::string_view key, std::string_view contents) = 0;

  // Opens a committed object for reading. NotFound if the key does not exist.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ObjectReader>>
  NewObjectReader(std::string_view key) = 0;
  // Size and owner of a committed object. NotFound if the key does not exist.
  [[nodiscard]] virtual absl::StatusOr<ObjectInfo> Stat(
      std::string_view key) = 0;
  // An absolute path a process on this machine may open to read the object
  // itself; only local-directory backends have one. The object need not exist.
  virtual std::optional<std::string> LocalPath(std::string_view /*key*/) const {
    return std::nullopt;
  }

  // Conveniences over Stat and NewObjectReader, kept while callers convert
  // (each ReadAt opens the object: a caller reading an object in pieces
  // opens one reader instead).
  [[nodiscard]] absl::StatusOr<uint64_t> ObjectSize(std::string_view key);
  [[nodiscard]] absl::Status ReadAt(std::string_view key, uint64_t offset,
                                    void* dst, uint64_t len);

  // Every committed key that starts with prefix, sorted.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> List(
      std::string_view prefix) = 0;
  // Deletes one object (OK if absent).
  [[nodiscard]] virtual absl::Status Delete(std::string_view key) = 0;
  // Deletes every object under prefix, and (local disk) the emptied
  // directories.
  [[nodiscard]] virtual absl::Status DeletePrefix(std::string_view prefix) = 0;

  // Memory the backend may do I/O from or into without copying (io_uring
  // registered buffers). Optional: a backend may ignore it. The region must
  // stay mapped until UnregisterMemory.
  [[nodiscard]] virtual absl::Status RegisterMemory(void* /*base*/,
                                                    uint64_t /*len*/) {
    return absl::OkStatus();
  }
  virtual void UnregisterMemory(void* /*base*/) {}

  virtual BackendStats stats() const = 0;
};

// Forwards every call to a target Backend it does not own (RocksDB's
// FileSystemWrapper). A subclass overrides only the calls it changes; its
// `using BackendWrapper::NewObjectWriter;` keeps the two-argument overload
// visible. Thread-safe as the target is.
class BackendWrapper : public Backend {
 public:
  explicit BackendWrapper(Backend* target) : target_(target) {}
  Backend* target() const { return target_; }

  using Backend::NewObjectWriter;
  std::string name() const override { return target_->name(); }
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const WriterOptions& options) override {
    return target_->NewObjectWriter(key, size, options);
  }
  [[nodiscard]] absl::Status PutSmallObject(
      std::string_view key, std::string_view contents) override {
    return target_->PutSmallObject(key, contents);
  }
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectReader>> NewObjectReader(
      std::string_view key) override {
    return target_->NewObjectReader(key);
  }
  absl::StatusOr<ObjectInfo> Stat(std::string_view key) override {
    return target_->Stat(key);
  }
  std::optional<std::string> LocalPath(std::string_view key) const override {
    return target_->LocalPath(key);
  }
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> List(
      std::string_view prefix) override {
    return target_->List(prefix);
  }
  absl::Status Delete(std::string_view key) override {
    return target_->Delete(key);
  }
  [[nodiscard]] absl::Status DeletePrefix(std::string_view prefix) override {
    return target_->DeletePrefix(prefix);
  }
  [[nodiscard]] absl::Status RegisterMemory(void* base, uint64_t len) override {
    return target_->RegisterMemory(base, len);
  }
  void UnregisterMemory(void* base) override {
    target_->UnregisterMemory(base);
  }
  BackendStats stats() const override { return target_->stats(); }

 private:
  Backend* const target_;
};

struct LocalBackendOptions {
  std::string root;             // created if missing
  bool use_io_uring = true;     // false (or no io_uring in the kernel): pwrite
  bool direct_io = true;        // O_DIRECT for aligned pieces
  unsigned queue_depth = 8;     // writes in flight per object
  uint64_t io_bytes = 4 << 20;  // bytes per write/read request
  bool sync = true;             // fsync file and directory on commit
  // Remove "*.tmp.*" crash leftovers under root at open. Only the root's
  // owner (the daemon, at start) asks for it: any other opener (a tool, a
  // reader, a library user) would remove a live writer's file in flight.
  bool remove_tmp_files = false;
  // Writers sharing a root (the nodes of a cluster) each give their temp
  // files a tag, "<key>.tmp.<tag>.<nonce>", and remove at open only the
  // leftovers with their own tag: another writer's temp file may be a
  // write in flight. Empty: "<key>.tmp.<nonce>", and every leftover goes.
  std::string tmp_tag;
};

// Local disk. Commit: write "<key>.tmp.[<tag>.]<nonce>", fsync, rename to
// key, fsync the directory. Keys ending in ".tmp.*" are never listed; a new
// backend on the same root removes leftovers of a crash (its own tag's).
// LocalPath(key) is "<root>/<key>" with root made absolute.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> NewLocalBackend(
    LocalBackendOptions options);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_BACKEND_H_
