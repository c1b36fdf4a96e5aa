// One signed S3 request with retries over pooled libcurl handles.
#include "storage/object_http.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/retry.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::storage::internal {
namespace {

constexpr uint64_t kMaxReplyBytes =
    16 << 20;  // XML replies (a list page ~300 KiB)
// An S3 error code or message quoted in ours.
constexpr size_t kMaxQuote = 120;

void GlobalInit() {
  static const bool done = [] {
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  }();
  (void)done;
}

bool RetryableCurl(CURLcode c) {
  switch (c) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_SEND_FAIL_REWIND:
      return true;
    default:
      return false;
  }
}

bool RetryableHttp(long status, std::string_view code) {
  if (status == 408 || status == 429 || status >= 500) return true;
  return code == "SlowDown" || code == "RequestTimeout" ||
         code == "InternalError" || code == "RequestTimeTooSkewed";
}

absl::StatusCode HttpCode(long status) {
  switch (status) {
    case 404:
      return absl::StatusCode::kNotFound;
    case 401:
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 409:
    case 412:
      return absl::StatusCode::kFailedPrecondition;
    case 416:
      return absl::StatusCode::kDataLoss;
    default:
      return status >= 500 || status == 429 || status == 408
                 ? absl::StatusCode::kUnavailable
                 : absl::StatusCode::kInvalidArgument;
  }
}

// Full jitter (AWS's recommendation): uniform in [0, min(cap, base*2^n)].
std::chrono::milliseconds Backoff(const ObjectStoreOptions& o,
                                  unsigned attempt) {
  return FullJitterBackoff(o.backoff_base_ms, o.backoff_max_ms, attempt);
}

}  // namespace

absl::StatusCode ReplyCode(long http_status, std::string_view s3_code) {
  // S3's SlowDown or RequestTimeTooSkewed may come as a 400 or a 403.
  return RetryableHttp(http_status, s3_code) ? absl::StatusCode::kUnavailable
                                             : HttpCode(http_status);
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' ||
        c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// State of one attempt, seen by curl's callbacks.
struct ObjectHttp::Attempt {
  const HttpRequest* request = nullptr;
  size_t segment = 0;
  uint64_t segment_off = 0;
  EVP_MD_CTX* md5 = nullptr;
  HttpResponse* response = nullptr;
  bool overflow = false;
  int write_errno = 0;  // a pwrite into HttpRequest::dst_fd failed

  static size_t Read(char* buf, size_t size, size_t n, void* arg) {
    auto* a = static_cast<Attempt*>(arg);
    const std::vector<Segment>& body = a->request->body;
    size_t want = size * n, done = 0;
    while (done < want && a->segment < body.size()) {
      const Segment& s = body[a->segment];
      uint64_t take = std::min<uint64_t>(want - done, s.len - a->segment_off);
      std::memcpy(buf + done, s.data + a->segment_off,
                  take);  // into curl's send buffer
      if (a->md5) EVP_DigestUpdate(a->md5, s.data + a->segment_off, take);
      done += take;
      a->segment_off += take;
      if (a->segment_off == s.len) ++a->segment, a->segment_off = 0;
    }
    return done;
  }
  // curl rewinds the body when it resends a request (a kept-alive
  // connection found dead); only a rewind to the start is needed.
  static int Seek(void* arg, curl_off_t offset, int origin) {
    auto* a = static_cast<Attempt*>(arg);
    if (offset != 0 || origin != SEEK_SET) return CURL_SEEKFUNC_CANTSEEK;
    a->segment = 0;
    a->segment_off = 0;
    if (a->md5) EVP_DigestInit_ex(a->md5, EVP_md5(), nullptr);
    return CURL_SEEKFUNC_OK;
  }
  static size_t Write(char* data, size_t size, size_t n, void* arg) {
    auto* a = static_cast<Attempt*>(arg);
    size_t len = size * n;
    HttpResponse* r = a->response;
    const HttpRequest* q = a->request;
    // Only a 2xx body goes into caller memory; an error body is XML.
    if (q->dst != nullptr && r->status / 100 == 2) {
      if (r->received + len > q->dst_len) {
        a->overflow = true;
        return 0;  // aborts the transfer
      }
      if (q->body_seen) q->body_seen(r->received, data, len);
      if (q->dst_fd < 0) {
        std::memcpy(q->dst + r->received, data, len);
      } else {
        for (size_t done = 0; done < len;) {
          const ssize_t w = ::pwrite(
              q->dst_fd, data + done, len - done,
              static_cast<off_t>(q->dst_file_offset + r->received + done));
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) {
            a->write_errno = w < 0 ? errno : EIO;
            return 0;  // aborts the transfer
          }
          done += static_cast<size_t>(w);
        }
      }
    } else {
      if (r->body.size() + len > kMaxReplyBytes) {
        a->overflow = true;
        return 0;
      }
      r->body.append(data, len);
    }
    r->received += len;
    return len;
  }
  static size_t Header(char* data, size_t size, size_t n, void* arg) {
    auto* a = static_cast<Attempt*>(arg);
    std::string_view line(data, size * n);
    if (line.substr(0, 5) == "HTTP/") {
      a->response->headers
          .clear();  // a 100 Continue or redirect before the real reply
      size_t sp = line.find(' ');
      long status = 0;
      if (sp != std::string_view::npos) {
        absl::SimpleAtoi(
            absl::string_view(line.data() + sp + 1,
                              std::min<size_t>(3, line.size() - sp - 1)),
            &status);
      }
      a->response->status = status;
      return size * n;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return size * n;
    std::string name =
        absl::AsciiStrToLower(absl::string_view(line.data(), colon));
    absl::string_view value = absl::StripAsciiWhitespace(
        absl::string_view(line.data() + colon + 1, line.size() - colon - 1));
    a->response->headers[name] = std::string(value);
    return size * n;
  }
};

ObjectHttp::ObjectHttp(const ObjectStoreOptions& options)
    : options_(options),
      userpwd_(absl::StrCat(options.credentials.access_key_id, ":",
                            options.credentials.secret_access_key)),
      sigv4_(absl::StrCat("aws:amz:", options.region, ":s3")) {
  GlobalInit();
}

ObjectHttp::~ObjectHttp() {
  for (void* h : idle_handles_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* ObjectHttp::AcquireHandle() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_handles_.empty()) {
      void* h = idle_handles_.back();
      idle_handles_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void ObjectHttp::ReleaseHandle(void* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_handles_.size() < 128) {
    idle_handles_.push_back(handle);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(handle));
  }
}

std::string ObjectHttp::Url(const HttpRequest& r) const {
  std::string url;
  std::string path =
      r.object.empty() ? "" : UriEncode(r.object, /*keep_slash=*/true);
  if (options_.addressing == ObjectAddressing::kVirtualHost) {
    size_t scheme_end = options_.endpoint.find("://") + 3;
    url = absl::StrCat(options_.endpoint.substr(0, scheme_end), options_.bucket,
                       ".", options_.endpoint.substr(scheme_end), "/", path);
  } else {
    url = absl::StrCat(options_.endpoint, "/", options_.bucket,
                       r.object.empty() ? "" : "/", path);
  }
  // std::map iterates sorted: SigV4's canonical query order.
  char sep = '?';
  for (const auto& [name, value] : r.query) {
    absl::StrAppend(&url, std::string(1, sep), UriEncode(name, false), "=",
                    UriEncode(value, false));
    sep = '&';
  }
  return url;
}

std::string ObjectHttp::Describe(const HttpRequest& r) const {
  return absl::StrCat("s3 ", r.method, " ", options_.endpoint, " bucket ",
                      options_.bucket, r.object.empty() ? "" : " key ",
                      r.object);
}

absl::StatusOr<HttpResponse> ObjectHttp::PerformOnce(void* h,
                                                     const HttpRequest& r,
                                                     bool* transport) {
  CURL* curl = static_cast<CURL*>(h);
  *transport = false;
  curl_easy_reset(curl);  // keeps the live connection and caches
  HttpResponse response;
  Attempt a;
  a.request = &r;
  a.response = &response;
  if (r.md5_of_body) {
    a.md5 = EVP_MD_CTX_new();
    EVP_DigestInit_ex(a.md5, EVP_md5(), nullptr);
  }
  uint64_t body_len = 0;
  for (const Segment& s : r.body) body_len += s.len;

  const std::string url = Url(r);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(curl, CURLOPT_AWS_SIGV4, sigv4_.c_str());
  curl_easy_setopt(curl, CURLOPT_USERPWD, userpwd_.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   long{options_.connect_timeout_ms});
  // A stall: under 1 byte/s for stall_timeout (whole seconds for curl).
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(
      curl, CURLOPT_LOW_SPEED_TIME,
      std::max(1L, static_cast<long>(options_.stall_timeout_ms / 1000)));
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Attempt::Header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Attempt::Write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &a);

  curl_slist* headers = nullptr;
  for (const std::string& hdr : r.headers)
    headers = curl_slist_append(headers, hdr.c_str());
  headers =
      curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  // curl adds "Expect: 100-continue" to bodies over 1 MiB (unsigned, which
  // S3 allows). Removing it with "Expect:" is not an option: curl 7.88
  // signs the removed header as "expect:" and the store then rejects the
  // signature. A server that ignores Expect costs at most this wait.
  curl_easy_setopt(curl, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
  if (!options_.credentials.session_token.empty()) {
    headers = curl_slist_append(headers,
                                absl::StrCat("x-amz-security-token: ",
                                             options_.credentials.session_token)
                                    .c_str());
  }
  if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &Attempt::Read);
    curl_easy_setopt(curl, CURLOPT_READDATA, &a);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, &Attempt::Seek);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &a);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE,
                     static_cast<curl_off_t>(body_len));
    if (r.method == "POST")
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "POST");
  } else if (r.method == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  ++requests_;
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (a.md5) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(a.md5, digest, &n);
    EVP_MD_CTX_free(a.md5);
    for (unsigned i = 0; i < n; ++i)
      absl::StrAppendFormat(&response.body_md5_hex, "%02x", digest[i]);
  }
  if (a.write_errno != 0) {
    return ErrnoToStatus(
        a.write_errno,
        absl::StrCat(Describe(r), ": writing the reply into its file at ",
                     r.dst_file_offset + response.received));
  }
  if (a.overflow) {
    return absl::DataLossError(
        absl::StrCat(Describe(r), ": reply body longer than ",
                     r.dst ? r.dst_len : kMaxReplyBytes, " bytes"));
  }
  if (rc != CURLE_OK) {
    *transport = true;
    // The code carries the retry class (util/retry.h IsTransient).
    absl::StatusCode code = !RetryableCurl(rc) ? absl::StatusCode::kInternal
                            : rc == CURLE_OPERATION_TIMEDOUT
                                ? absl::StatusCode::kDeadlineExceeded
                                : absl::StatusCode::kUnavailable;
    return absl::Status(
        code, absl::StrCat(Describe(r), ": ", curl_easy_strerror(rc)));
  }
  if (response.status / 100 != 2) {
    std::string code, message;
    if (!response.body.empty()) {
      absl::StatusOr<XmlReply> xml =
          XmlReply::Parse(response.body, Describe(r));
      if (xml.ok()) {
        code = xml->Find("Error.Code").value_or("");
        message = xml->Find("Error.Message").value_or("");
      }
    }
    return absl::Status(
        ReplyCode(response.status, code),
        absl::StrCat(Describe(r), ": HTTP ", response.status,
                     code.empty() ? "" : " ", QuotePrefix(code, kMaxQuote),
                     message.empty() ? "" : ": ",
                     QuotePrefix(message, kMaxQuote)));
  }
  if (r.dst != nullptr && r.method == "GET" && response.received != r.dst_len) {
    // curl saw a complete reply (a Content-Length it honoured) of the
    // wrong size: the store's object is not what was asked for.
    return absl::DataLossError(absl::StrCat(Describe(r), ": reply of ",
                                            response.received,
                                            " bytes, expected ", r.dst_len));
  }
  return response;
}

absl::StatusOr<HttpResponse> ObjectHttp::Perform(const HttpRequest& r) {
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::milliseconds(options_.retry_budget_ms);
  void* handle = AcquireHandle();
  if (handle == nullptr)
    return absl::ResourceExhaustedError("curl_easy_init failed");
  absl::Status last;
  unsigned attempt = 0;
  for (;;) {
    bool transport = false;
    absl::StatusOr<HttpResponse> result = PerformOnce(handle, r, &transport);
    ++attempt;
    if (result.ok()) {
      ReleaseHandle(handle);
      result->attempts = attempt;
      return result;
    }
    last = result.status();
    if (!IsTransient(last)) break;
    // A transfer that failed below HTTP may have left a half-dead
    // connection: the next attempt gets a new one. An HTTP error reply
    // leaves the connection usable.
    if (transport) {
      curl_easy_cleanup(static_cast<CURL*>(handle));
      handle = curl_easy_init();
      if (handle == nullptr)
        return absl::ResourceExhaustedError("curl_easy_init failed");
    }
    auto wait = Backoff(options_, attempt - 1);
    if (attempt >= options_.max_attempts ||
        std::chrono::steady_clock::now() - start + wait > budget) {
      ReleaseHandle(handle);
      return absl::Status(
          last.code(),
          absl::StrCat(last.message(), " (gave up after ", attempt,
                       " attempts in ",
                       absl::StrFormat(
                           "%.1f", std::chrono::duration<double>(
                                       std::chrono::steady_clock::now() - start)
                                       .count()),
                       " s)"));
    }
    ++retries_;
    std::this_thread::sleep_for(wait);
  }
  ReleaseHandle(handle);
  return last;
}

}  // namespace ckpt::storage::internal
