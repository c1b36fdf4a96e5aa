// The object-store Backend (object_backend.h): keys, List/Stat/Delete,
// small objects and readers. The multipart writer is object_writer.cc.
#include "storage/object_backend.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/local_fs.h"
#include "storage/object_http.h"
#include "storage/object_internal.h"
#include "util/status.h"

namespace ckpt::storage {
namespace internal {

absl::StatusOr<uint64_t> ContentLength(const HttpResponse& r,
                                       const std::string& what) {
  auto it = r.headers.find("content-length");
  uint64_t v = 0;
  if (it == r.headers.end() || !absl::SimpleAtoi(it->second, &v))
    return absl::DataLossError(
        absl::StrCat(what, ": reply has no valid Content-Length"));
  return v;
}

absl::Status CheckEtagMd5(const HttpResponse& r, const std::string& what) {
  auto it = r.headers.find("etag");
  if (it == r.headers.end())
    return absl::DataLossError(absl::StrCat(what, ": reply has no ETag"));
  std::string etag = it->second;
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  if (etag != r.body_md5_hex)
    return absl::DataLossError(
        absl::StrCat(what, ": the store's MD5 (ETag ", etag.substr(0, 40),
                     ") is not that of the bytes sent (", r.body_md5_hex,
                     "): damaged in transit"));
  return absl::OkStatus();
}

namespace {

// One open object: its size read once (HEAD); each ReadAt splits its range
// into part_size pieces fetched by up to `concurrency` threads.
class ObjectReaderImpl : public ObjectReader {
 public:
  ObjectReaderImpl(ObjectBackendImpl* backend, std::string key,
                   std::string object, uint64_t size)
      : backend_(backend),
        key_(std::move(key)),
        object_(std::move(object)),
        size_(size) {}
  uint64_t size() const override { return size_; }

  absl::Status ReadAt(uint64_t offset, void* dst, uint64_t len) override {
    return Read(offset, dst, len, nullptr, {}, nullptr);
  }
  absl::Status ReadAtNotify(uint64_t offset, void* dst, uint64_t len,
                            const Arrived& arrived) override {
    return Read(offset, dst, len, &arrived, {}, nullptr);
  }
  absl::Status ReadAtNotifyToFile(uint64_t offset, void* dst, uint64_t len,
                                  const DestFile& file, const Arrived& arrived,
                                  const Received& received) override {
    return Read(offset, dst, len, &arrived, file,
                received ? &received : nullptr);
  }

 private:
  // Each piece is reported to `arrived` (if any) by the thread that got it,
  // and its bytes shown to `received` (if any) as they come in. With
  // file.fd >= 0 the pieces are written into that file, which dst maps at
  // file.offset.
  absl::Status Read(uint64_t offset, void* dst, uint64_t len,
                    const Arrived* arrived, const DestFile& file,
                    const Received* received) {
    if (offset > size_ || len > size_ - offset)
      return absl::DataLossError(
          absl::StrCat("object ", key_, ": range [", offset, ", ", offset + len,
                       ") is past its end (", size_, " bytes)"));
    if (len == 0) return absl::OkStatus();
    const uint64_t piece = backend_->options().part_size;
    const uint64_t pieces = (len + piece - 1) / piece;
    std::atomic<uint64_t> next{0};
    std::mutex mu;
    absl::Status first_error;
    auto work = [&] {
      for (uint64_t i = next++; i < pieces; i = next++) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error.ok()) return;
        }
        uint64_t off = offset + i * piece;
        uint64_t n = std::min(piece, offset + len - off);
        std::function<void(uint64_t, const char*, size_t)> seen;
        if (received != nullptr)
          seen = [received, off](uint64_t at, const char* data, size_t m) {
            (*received)(off, off + at, data, m);
          };
        absl::Status s = backend_->GetRange(
            key_, object_, size_, off, static_cast<char*>(dst) + (off - offset),
            n, file.fd, file.offset + (off - offset), seen);
        if (!s.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = s;
          return;
        }
        if (arrived != nullptr) (*arrived)(off, n);
      }
    };
    const unsigned threads = static_cast<unsigned>(
        std::min<uint64_t>(pieces, backend_->options().concurrency));
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    if (first_error.ok()) backend_->CountRead(len);
    return first_error;
  }

  ObjectBackendImpl* const backend_;
  const std::string key_, object_;
  const uint64_t size_;
};

}  // namespace

ObjectBackendImpl::ObjectBackendImpl(ObjectStoreOptions options)
    : options_(std::move(options)), http_(options_) {}

std::string ObjectBackendImpl::ObjectName(std::string_view key) const {
  return options_.prefix.empty()
             ? std::string(key)
             : absl::StrCat(options_.prefix, "/", std::string(key));
}

absl::Status ObjectBackendImpl::GetRange(const std::string& key,
                                         const std::string& object,
                                         uint64_t object_size, uint64_t off,
                                         char* dst, uint64_t n, int file_fd,
                                         uint64_t file_offset,
                                         const BodySeen& seen) {
  HttpRequest req;
  req.method = "GET";
  req.object = object;
  req.headers.push_back(absl::StrCat("Range: bytes=", off, "-", off + n - 1));
  req.dst = dst;
  req.dst_len = n;
  req.dst_fd = file_fd;
  req.dst_file_offset = file_offset;
  req.body_seen = seen;
  absl::StatusOr<HttpResponse> r = http_.Perform(req);
  if (!r.ok()) {
    if (r.status().code() == absl::StatusCode::kDataLoss ||
        absl::IsNotFound(r.status()))
      return absl::DataLossError(
          absl::StrCat("object ", key, ": ", r.status().message()));
    return r.status();
  }
  // A 200 (the whole object) is right only when the range is the whole object.
  const bool whole = off == 0 && n == object_size;
  if (r->status != 206 && !(r->status == 200 && whole))
    return absl::DataLossError(
        absl::StrCat("object ", key, ": ranged GET answered HTTP ", r->status));
  if (r->status == 206) {
    auto it = r->headers.find("content-range");
    std::string want =
        absl::StrCat("bytes ", off, "-", off + n - 1, "/", object_size);
    if (it == r->headers.end() || it->second != want)
      return absl::DataLossError(absl::StrCat(
          "object ", key, ": Content-Range is \"",
          it == r->headers.end() ? "" : it->second.substr(0, 80),
          "\", expected \"", want, "\" (the object changed or is damaged)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ObjectInfo> ObjectBackendImpl::Stat(std::string_view key) {
  CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
  HttpRequest req;
  req.method = "HEAD";
  req.object = ObjectName(key);
  CKPT_ASSIGN_OR_RETURN(HttpResponse r, http_.Perform(req));
  ObjectInfo info;
  CKPT_ASSIGN_OR_RETURN(info.size, ContentLength(r, http_.Describe(req)));
  return info;
}

absl::StatusOr<std::unique_ptr<ObjectReader>>
ObjectBackendImpl::NewObjectReader(std::string_view key) {
  CKPT_ASSIGN_OR_RETURN(ObjectInfo info, Stat(key));
  return std::unique_ptr<ObjectReader>(std::make_unique<ObjectReaderImpl>(
      this, std::string(key), ObjectName(key), info.size));
}

absl::Status ObjectBackendImpl::PutSmallObject(std::string_view key,
                                               std::string_view contents) {
  CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
  CKPT_RETURN_IF_ERROR(
      PutWhole(ObjectName(key), {{contents.data(), contents.size()}}));
  ++objects_committed_;
  bytes_written_ += contents.size();
  return absl::OkStatus();
}

absl::Status ObjectBackendImpl::PutWhole(const std::string& object,
                                         std::vector<Segment> body) {
  HttpRequest req;
  req.method = "PUT";
  req.object = object;
  req.body = std::move(body);
  req.md5_of_body = options_.verify_part_md5;
  CKPT_ASSIGN_OR_RETURN(HttpResponse r, http_.Perform(req));
  if (options_.verify_part_md5)
    CKPT_RETURN_IF_ERROR(CheckEtagMd5(r, http_.Describe(req)));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ObjectBackendImpl::List(
    std::string_view prefix) {
  CKPT_RETURN_IF_ERROR(internal::ValidatePrefix(prefix));
  const std::string base = options_.prefix.empty() ? "" : options_.prefix + "/";
  std::vector<std::string> out;
  std::string token;
  for (int page = 0;; ++page) {
    HttpRequest req;
    req.method = "GET";
    req.query = {{"list-type", "2"},
                 {"max-keys", absl::StrCat(options_.list_page_size)},
                 {"prefix", absl::StrCat(base, std::string(prefix))}};
    if (!token.empty()) req.query["continuation-token"] = token;
    req.what = "list";
    CKPT_ASSIGN_OR_RETURN(HttpResponse r, http_.Perform(req));
    const std::string what = absl::StrCat(http_.Describe(req), " list prefix ",
                                          base, std::string(prefix));
    CKPT_ASSIGN_OR_RETURN(XmlReply xml, XmlReply::Parse(r.body, what));
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys,
                          xml.Each("ListBucketResult", "Contents", "Key"));
    for (std::string& k : keys) {
      if (k.compare(0, base.size(), base) != 0 ||
          k.compare(base.size(), prefix.size(), prefix) != 0)
        return absl::DataLossError(absl::StrCat(
            what, ": listed key outside the prefix: ", k.substr(0, 80)));
      std::string key = k.substr(base.size());
      // Objects that are not valid keys (someone else's) are not ours to list.
      if (internal::ValidateKey(key).ok()) out.push_back(std::move(key));
    }
    std::string truncated =
        xml.Find("ListBucketResult.IsTruncated").value_or("false");
    if (truncated != "true") break;
    CKPT_ASSIGN_OR_RETURN(token,
                          xml.Get("ListBucketResult.NextContinuationToken"));
    if (token.empty() || page > 1000000)
      return absl::DataLossError(
          absl::StrCat(what, ": truncated page without a continuation token"));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

absl::Status ObjectBackendImpl::Delete(std::string_view key) {
  CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
  HttpRequest req;
  req.method = "DELETE";
  req.object = ObjectName(key);
  absl::StatusOr<HttpResponse> r = http_.Perform(req);
  if (!r.ok() && !absl::IsNotFound(r.status())) return r.status();
  return absl::OkStatus();
}

absl::Status ObjectBackendImpl::DeletePrefix(std::string_view prefix) {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(prefix));
  // Manifests first: a half-deleted step is never visible as good.
  std::stable_partition(keys.begin(), keys.end(), [](const std::string& k) {
    return k.find("/MANIFEST") != std::string::npos;
  });
  for (const std::string& k : keys) CKPT_RETURN_IF_ERROR(Delete(k));
  return absl::OkStatus();
}

BackendStats ObjectBackendImpl::stats() const {
  BackendStats s;
  s.bytes_written = bytes_written_.load();
  s.bytes_read = bytes_read_.load();
  s.objects_committed = objects_committed_.load();
  return s;
}

ObjectStoreStats ObjectBackendImpl::object_stats() const {
  ObjectStoreStats s;
  s.requests = http_.requests();
  s.retries = http_.retries();
  s.aborted_uploads = aborted_uploads_.load();
  return s;
}

}  // namespace internal

absl::StatusOr<std::unique_ptr<Backend>> NewObjectBackend(
    ObjectStoreOptions options) {
  if (options.part_size < (5u << 20) || options.part_size > (uint64_t{5} << 30))
    return absl::InvalidArgumentError(
        "object part size: not in [5 MiB, 5 GiB]");
  if (options.concurrency < 1 || options.concurrency > 64)
    return absl::InvalidArgumentError("object concurrency: not in [1, 64]");
  if (options.list_page_size < 1 || options.list_page_size > 1000)
    return absl::InvalidArgumentError(
        "object list page size: not in [1, 1000]");
  if (options.max_attempts < 1)
    return absl::InvalidArgumentError("object max attempts: 0");
  if (options.bucket.empty())
    return absl::InvalidArgumentError("object bucket: empty");
  if (options.endpoint.find("://") == std::string::npos)
    return absl::InvalidArgumentError(
        "object endpoint: not scheme://host[:port]");
  return std::unique_ptr<Backend>(
      std::make_unique<internal::ObjectBackendImpl>(std::move(options)));
}

ObjectStoreStats GetObjectStoreStats(const Backend& backend) {
  const Backend* b = &backend;
  while (auto* w = dynamic_cast<const BackendWrapper*>(b)) b = w->target();
  if (auto* o = dynamic_cast<const internal::ObjectBackendImpl*>(b))
    return o->object_stats();
  return {};
}

}  // namespace ckpt::storage
