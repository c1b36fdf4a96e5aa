// The HTTP layer of the object backend: one signed S3 request over a pooled
// libcurl easy handle (connection reuse), retried with exponential backoff
// and full jitter on the transient failures (5xx, 429, SlowDown,
// RequestTimeout, timeouts, stalls, resets), and every failure turned into
// a Status in one place (ToStatus) naming method, endpoint, bucket and key.
// Request bodies are read from caller memory through a gather list (no
// copy); a response body goes either into a string (XML, capped) or
// straight into caller memory (ranged GET).
//
// XML replies are parsed by XmlReply (storage/object_xml.h).
//
// Thread-safety: ObjectHttp is safe for concurrent use (the handle pool is
// locked; each request has its own handle).
#ifndef CKPT_STORAGE_OBJECT_HTTP_H_
#define CKPT_STORAGE_OBJECT_HTTP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/object_backend.h"
#include "storage/object_xml.h"

namespace ckpt::storage::internal {

// A run of request-body bytes in caller memory.
struct Segment {
  const char* data = nullptr;
  uint64_t len = 0;
};

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string object;  // full object name (prefix included); "" = the bucket
  // Query parameters; encoded and sorted (SigV4's canonical order) by the
  // layer. A parameter with an empty value is sent as "name=".
  std::map<std::string, std::string> query;
  std::vector<std::string> headers;  // "Name: value"
  std::vector<Segment> body;         // PUT/POST body, in order
  // GET into caller memory: the reply body must be exactly dst_len bytes.
  char* dst = nullptr;
  uint64_t dst_len = 0;
  // With dst: dst maps this file at dst_file_offset; the body is written
  // into the file (pwrite) instead of stored through dst
  // (ObjectReader::ReadAtNotifyToFile).
  int dst_fd = -1;
  uint64_t dst_file_offset = 0;
  // With dst: shown each piece of a 2xx reply's body before it is stored,
  // with its offset in the body; an attempt that starts over (a retry)
  // starts again at 0.
  std::function<void(uint64_t at, const char* data, size_t n)> body_seen;
  bool md5_of_body = false;  // compute the MD5 of what was sent
  // For messages: what the request is about (the key without the prefix
  // is clearer to a user, but the full object name is what the store has).
  std::string what;
};

struct HttpResponse {
  long status = 0;
  std::string body;                            // not filled for GET into dst
  std::map<std::string, std::string> headers;  // lowercase names
  uint64_t received = 0;                       // body bytes received
  std::string body_md5_hex;                    // when md5_of_body
  unsigned attempts = 0;
};

class ObjectHttp {
 public:
  explicit ObjectHttp(const ObjectStoreOptions& options);
  ~ObjectHttp();
  ObjectHttp(const ObjectHttp&) = delete;
  ObjectHttp& operator=(const ObjectHttp&) = delete;

  // Sends the request, retrying transient failures. Returns the response
  // of a 2xx reply; 404 is NotFound, 403 PermissionDenied, 416 DataLoss,
  // other 4xx InvalidArgument/FailedPrecondition, an exhausted retry budget
  // Unavailable (or DeadlineExceeded for stalls); each message names
  // method, endpoint, bucket, object and the store's error code.
  [[nodiscard]] absl::StatusOr<HttpResponse> Perform(
      const HttpRequest& request);

  // "<METHOD> <endpoint> bucket <bucket> key <object>": the context of
  // every message about the request.
  std::string Describe(const HttpRequest& request) const;

  const ObjectStoreOptions& options() const { return options_; }
  uint64_t requests() const { return requests_.load(); }
  uint64_t retries() const { return retries_.load(); }

 private:
  struct Attempt;
  void* AcquireHandle();
  void ReleaseHandle(void* handle);
  std::string Url(const HttpRequest& request) const;
  // One attempt. On failure the code says whether to try again
  // (util/retry.h IsTransient) and *transport whether it failed below HTTP
  // (the connection is suspect).
  absl::StatusOr<HttpResponse> PerformOnce(void* handle,
                                           const HttpRequest& request,
                                           bool* transport);

  const ObjectStoreOptions options_;
  const std::string userpwd_;
  const std::string sigv4_;
  std::mutex mu_;
  std::vector<void*> idle_handles_;  // CURL*, each with its live connection
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> retries_{0};
};

// SigV4's URI encoding (RFC 3986 unreserved kept; '/' kept when
// keep_slash).
std::string UriEncode(std::string_view s, bool keep_slash);

// The code of a reply that is not 2xx, given its HTTP status and S3 error
// code: UNAVAILABLE exactly when it is worth retrying (throttling, a
// timeout, a server error, clock skew), so that util/retry.h's IsTransient
// is the retry decision; else by HTTP status (404 NotFound, 401/403
// PermissionDenied, 409/412 FailedPrecondition, 416 DataLoss, other
// InvalidArgument).
absl::StatusCode ReplyCode(long http_status, std::string_view s3_code);

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_OBJECT_HTTP_H_
