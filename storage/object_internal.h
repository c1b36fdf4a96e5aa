// The object backend's class, shared by its two source files
// (object_backend.cc: keys, reads, list, delete; object_writer.cc: the
// multipart writer). Private to storage/. Thread-safe as backend.h says.
#ifndef CKPT_STORAGE_OBJECT_INTERNAL_H_
#define CKPT_STORAGE_OBJECT_INTERNAL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "storage/backend.h"
#include "storage/object_backend.h"
#include "storage/object_http.h"

namespace ckpt::storage::internal {

// Content-Length of a reply, DataLoss naming `what` when absent or bad.
[[nodiscard]] absl::StatusOr<uint64_t> ContentLength(const HttpResponse& r,
                                                     const std::string& what);
// The reply's ETag must be the MD5 of what was sent (body_md5_hex):
// DataLoss naming `what` otherwise.
[[nodiscard]] absl::Status CheckEtagMd5(const HttpResponse& r,
                                        const std::string& what);

class ObjectBackendImpl : public Backend {
 public:
  explicit ObjectBackendImpl(ObjectStoreOptions options);

  std::string name() const override { return "s3"; }
  using Backend::NewObjectWriter;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const WriterOptions& options) override;
  [[nodiscard]] absl::Status PutSmallObject(std::string_view key,
                                            std::string_view contents) override;
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ObjectReader>> NewObjectReader(
      std::string_view key) override;
  [[nodiscard]] absl::StatusOr<ObjectInfo> Stat(std::string_view key) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> List(
      std::string_view prefix) override;
  [[nodiscard]] absl::Status Delete(std::string_view key) override;
  [[nodiscard]] absl::Status DeletePrefix(std::string_view prefix) override;
  BackendStats stats() const override;

  ObjectStoreStats object_stats() const;
  const ObjectStoreOptions& options() const { return options_; }
  ObjectHttp& http() { return http_; }
  // "<prefix>/<key>".
  std::string ObjectName(std::string_view key) const;

  // One ranged GET of [off, off+n) of an object of object_size bytes into
  // dst, its reply checked (206, Content-Range, length); DataLoss naming key.
  // `file_fd` >= 0: dst maps that file at `file_offset`, and the bytes are
  // written into the file (HttpRequest::dst_fd). `seen` (may be empty):
  // HttpRequest::body_seen.
  using BodySeen = std::function<void(uint64_t at, const char*, size_t)>;
  [[nodiscard]] absl::Status GetRange(const std::string& key,
                                      const std::string& object,
                                      uint64_t object_size, uint64_t off,
                                      char* dst, uint64_t n, int file_fd = -1,
                                      uint64_t file_offset = 0,
                                      const BodySeen& seen = {});
  // One PUT of the whole object from body, its ETag checked.
  [[nodiscard]] absl::Status PutWhole(const std::string& object,
                                      std::vector<Segment> body);

  void CountRead(uint64_t n) { bytes_read_ += n; }
  void CountCommit(uint64_t n) {
    bytes_written_ += n;
    ++objects_committed_;
  }
  void CountAbort() { ++aborted_uploads_; }

 private:
  const ObjectStoreOptions options_;
  ObjectHttp http_;
  std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0},
      objects_committed_{0};
  std::atomic<uint64_t> aborted_uploads_{0};
};

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_OBJECT_INTERNAL_H_
