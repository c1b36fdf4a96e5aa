// The object backend's writer: a multipart upload from caller memory with
// up to `concurrency` parts in flight, each part sent as soon as all of
// its bytes were given to WriteAt; a single PUT for an object of at most
// one part. Any failure aborts the upload (no orphaned parts).
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "storage/local_fs.h"
#include "storage/object_internal.h"
#include "util/status.h"

namespace ckpt::storage::internal {
namespace {

class MultipartWriter : public ObjectWriter {
 public:
  MultipartWriter(ObjectBackendImpl* backend, std::string key, uint64_t size)
      : backend_(backend),
        key_(std::move(key)),
        object_(backend->ObjectName(key_)),
        size_(size),
        part_size_(backend->options().part_size),
        parts_(size == 0 ? 1 : (size + part_size_ - 1) / part_size_),
        multipart_(size > part_size_),
        covered_(parts_, 0),
        etags_(parts_) {}
  ~MultipartWriter() override { Abort(); }

  // Starts the multipart upload (CreateMultipartUpload) when one is needed.
  absl::Status Open() {
    if (!multipart_) return absl::OkStatus();
    HttpRequest req;
    req.method = "POST";
    req.object = object_;
    req.query = {{"uploads", ""}};
    CKPT_ASSIGN_OR_RETURN(HttpResponse r, backend_->http().Perform(req));
    CKPT_ASSIGN_OR_RETURN(
        XmlReply xml, XmlReply::Parse(r.body, backend_->http().Describe(req)));
    CKPT_ASSIGN_OR_RETURN(upload_id_,
                          xml.Get("InitiateMultipartUploadResult.UploadId"));
    if (upload_id_.empty() || upload_id_.size() > 1024)
      return absl::DataLossError(
          absl::StrCat(backend_->http().Describe(req), ": bad UploadId"));
    // A retried create may have created an upload whose reply was lost:
    // abort every other upload of this key (one writer per key).
    if (r.attempts > 1) AbortOtherUploads();
    return absl::OkStatus();
  }

  absl::Status WriteAt(uint64_t offset, const void* data,
                       uint64_t len) override {
    if (offset > size_ || len > size_ - offset)
      return absl::InvalidArgumentError(
          absl::StrCat("object ", key_, ": write [", offset, ", ", offset + len,
                       ") past its size ", size_));
    if (len == 0) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    if (done_)
      return absl::FailedPreconditionError(
          absl::StrCat("object ", key_, ": writer closed"));
    if (!error_.ok()) return error_;
    auto next = pieces_.lower_bound(offset);
    if (next != pieces_.end() && next->first < offset + len)
      return absl::InvalidArgumentError(absl::StrCat(
          "object ", key_, ": write at ", offset, " overlaps an earlier one"));
    if (next != pieces_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second.len > offset)
        return absl::InvalidArgumentError(
            absl::StrCat("object ", key_, ": write at ", offset,
                         " overlaps an earlier one"));
    }
    pieces_.emplace(offset, Segment{static_cast<const char*>(data), len});
    bytes_ += len;
    for (uint64_t p = offset / part_size_; p <= (offset + len - 1) / part_size_;
         ++p) {
      uint64_t lo = std::max(offset, p * part_size_);
      uint64_t hi = std::min(offset + len, PartEnd(p));
      covered_[p] += hi - lo;
      if (multipart_ && covered_[p] == PartEnd(p) - p * part_size_)
        ready_.push_back(p);
    }
    if (multipart_ && !ready_.empty()) {
      const size_t want =
          std::min<size_t>(backend_->options().concurrency, parts_);
      while (workers_.size() < want) workers_.emplace_back([this] { Work(); });
      cv_.notify_all();
    }
    return absl::OkStatus();
  }

  absl::Status Commit() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_)
        return absl::FailedPreconditionError(
            absl::StrCat("object ", key_, ": writer closed"));
    }
    if (bytes_ != size_) {
      Abort();
      return absl::FailedPreconditionError(
          absl::StrCat("object ", key_, ": commit after ", bytes_, " of ",
                       size_, " bytes written"));
    }
    if (!multipart_) {
      std::vector<Segment> body;
      for (const auto& [off, seg] : pieces_) body.push_back(seg);
      absl::Status s = backend_->PutWhole(object_, std::move(body));
      done_ = true;
      if (s.ok()) backend_->CountCommit(size_);
      return s;
    }
    absl::Status s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return finished_ == parts_ || !error_.ok(); });
      s = error_;
    }
    StopWorkers();
    if (s.ok()) s = Complete();
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      backend_->CountCommit(size_);
      return s;
    }
    absl::Status aborted = AbortUpload();
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    if (!aborted.ok())
      return absl::Status(
          s.code(),
          absl::StrCat(s.message(), "; and aborting the upload failed ",
                       "(parts may be left behind): ", aborted.message()));
    return s;
  }

  void Abort() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
    }
    StopWorkers();
    (void)AbortUpload();
  }

 private:
  uint64_t PartEnd(uint64_t p) const {
    return std::min(size_, (p + 1) * part_size_);
  }

  void StopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  // The pieces of part p, cut to its range (caller holds mu_).
  std::vector<Segment> SegmentsOf(uint64_t p) const {
    std::vector<Segment> out;
    const uint64_t lo = p * part_size_, hi = PartEnd(p);
    auto it = pieces_.upper_bound(lo);
    if (it != pieces_.begin()) --it;
    for (; it != pieces_.end() && it->first < hi; ++it) {
      uint64_t a = std::max(lo, it->first),
               b = std::min(hi, it->first + it->second.len);
      if (a < b) out.push_back({it->second.data + (a - it->first), b - a});
    }
    return out;
  }

  void Work() {
    for (;;) {
      uint64_t p;
      std::vector<Segment> body;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock,
                 [&] { return stop_ || !error_.ok() || !ready_.empty(); });
        if (stop_ || !error_.ok()) return;
        p = ready_.front();
        ready_.pop_front();
        body = SegmentsOf(p);
      }
      absl::StatusOr<std::string> etag = UploadPart(p, std::move(body));
      std::lock_guard<std::mutex> lock(mu_);
      if (etag.ok()) {
        etags_[p] = *std::move(etag);
        ++finished_;
      } else if (error_.ok()) {
        error_ = etag.status();
      }
      cv_.notify_all();
    }
  }

  absl::StatusOr<std::string> UploadPart(uint64_t p,
                                         std::vector<Segment> body) {
    HttpRequest req;
    req.method = "PUT";
    req.object = object_;
    req.query = {{"partNumber", absl::StrCat(p + 1)}, {"uploadId", upload_id_}};
    req.body = std::move(body);
    req.md5_of_body = backend_->options().verify_part_md5;
    const std::string what =
        absl::StrCat(backend_->http().Describe(req), " part ", p + 1);
    CKPT_ASSIGN_OR_RETURN(HttpResponse r, backend_->http().Perform(req));
    if (req.md5_of_body) CKPT_RETURN_IF_ERROR(CheckEtagMd5(r, what));
    auto it = r.headers.find("etag");
    if (it == r.headers.end() || it->second.empty() || it->second.size() > 256)
      return absl::DataLossError(
          absl::StrCat(what, ": reply has no valid ETag"));
    return it->second;
  }

  absl::Status Complete() {
    std::string xml = "<CompleteMultipartUpload>";
    for (uint64_t p = 0; p < parts_; ++p) {
      absl::StrAppend(&xml, "<Part><PartNumber>", p + 1, "</PartNumber><ETag>",
                      etags_[p], "</ETag></Part>");
    }
    xml += "</CompleteMultipartUpload>";
    HttpRequest req;
    req.method = "POST";
    req.object = object_;
    req.query = {{"uploadId", upload_id_}};
    req.headers = {"Content-Type: application/xml"};
    req.body = {{xml.data(), xml.size()}};
    CKPT_ASSIGN_OR_RETURN(HttpResponse r, backend_->http().Perform(req));
    // S3 may answer 200 with an <Error> body for a failed completion.
    CKPT_ASSIGN_OR_RETURN(
        XmlReply reply,
        XmlReply::Parse(r.body, backend_->http().Describe(req)));
    if (std::optional<std::string> code = reply.Find("Error.Code"))
      return absl::UnavailableError(absl::StrCat(
          backend_->http().Describe(req),
          ": completing the upload failed: ", code->substr(0, 40)));
    CKPT_RETURN_IF_ERROR(
        reply.Get("CompleteMultipartUploadResult.ETag").status());
    // The store's view of the object must be what was written.
    CKPT_ASSIGN_OR_RETURN(ObjectInfo info, backend_->Stat(key_));
    if (info.size != size_)
      return absl::DataLossError(
          absl::StrCat("object ", key_, ": ", info.size,
                       " bytes after the upload, expected ", size_));
    upload_id_.clear();
    return absl::OkStatus();
  }

  // Best effort: what it cannot abort, a bucket lifecycle rule
  // (AbortIncompleteMultipartUpload) removes.
  void AbortOtherUploads() {
    HttpRequest list;
    list.method = "GET";
    list.query = {{"uploads", ""}, {"prefix", object_}};
    absl::StatusOr<HttpResponse> r = backend_->http().Perform(list);
    if (!r.ok()) return;
    absl::StatusOr<XmlReply> xml =
        XmlReply::Parse(r->body, backend_->http().Describe(list));
    if (!xml.ok()) return;
    absl::StatusOr<std::vector<std::string>> keys =
        xml->Each("ListMultipartUploadsResult", "Upload", "Key");
    absl::StatusOr<std::vector<std::string>> ids =
        xml->Each("ListMultipartUploadsResult", "Upload", "UploadId");
    if (!keys.ok() || !ids.ok() || keys->size() != ids->size()) return;
    for (size_t i = 0; i < ids->size(); ++i) {
      if ((*keys)[i] != object_ || (*ids)[i] == upload_id_) continue;
      HttpRequest abort;
      abort.method = "DELETE";
      abort.object = object_;
      abort.query = {{"uploadId", (*ids)[i]}};
      if (backend_->http().Perform(abort).ok()) backend_->CountAbort();
    }
  }

  absl::Status AbortUpload() {
    if (!multipart_ || upload_id_.empty()) return absl::OkStatus();
    HttpRequest req;
    req.method = "DELETE";
    req.object = object_;
    req.query = {{"uploadId", upload_id_}};
    absl::StatusOr<HttpResponse> r = backend_->http().Perform(req);
    upload_id_.clear();
    backend_->CountAbort();
    if (!r.ok() && !absl::IsNotFound(r.status())) return r.status();
    return absl::OkStatus();
  }

  ObjectBackendImpl* const backend_;
  const std::string key_, object_;
  const uint64_t size_, part_size_, parts_;
  const bool multipart_;
  std::string upload_id_;  // set by Open, read by workers after

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Segment> pieces_;  // by offset, never overlapping
  std::vector<uint64_t> covered_;       // bytes given, per part
  std::deque<uint64_t> ready_;          // parts whose bytes are all given
  std::vector<std::string> etags_;
  std::vector<std::thread> workers_;
  uint64_t bytes_ = 0, finished_ = 0;
  absl::Status error_;
  bool stop_ = false, done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ObjectWriter>>
ObjectBackendImpl::NewObjectWriter(
    std::string_view key, uint64_t size,
    const WriterOptions& /*options: no owners*/) {
  CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
  if (size > options_.part_size * 10000)
    return absl::InvalidArgumentError(absl::StrCat(
        "object ", std::string(key), ": ", size,
        " bytes need more than 10000 parts of ", options_.part_size));
  auto writer = std::make_unique<MultipartWriter>(this, std::string(key), size);
  CKPT_RETURN_IF_ERROR(writer->Open());
  return std::unique_ptr<ObjectWriter>(std::move(writer));
}

}  // namespace ckpt::storage::internal
