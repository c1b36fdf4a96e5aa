// The object store's limits with plain libcurl (object_raw.h): no
// retries, no checksums, no copies of ours; the request bodies go from
// memory through CURLOPT_POSTFIELDS and the replies straight into the
// destination buffer.
#include "bench/object_raw.h"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::bench {
namespace {

using storage::ObjectStoreOptions;

struct Easy {
  CURL* curl = curl_easy_init();
  ~Easy() { curl_easy_cleanup(curl); }
};

std::string Url(const ObjectStoreOptions& o, const std::string& key,
                const std::string& query) {
  std::string object = o.prefix.empty() ? key : o.prefix + "/" + key;
  std::string base;
  if (o.addressing == storage::ObjectAddressing::kVirtualHost) {
    size_t s = o.endpoint.find("://") + 3;
    base = absl::StrCat(o.endpoint.substr(0, s), o.bucket, ".",
                        o.endpoint.substr(s));
  } else {
    base = absl::StrCat(o.endpoint, "/", o.bucket);
  }
  return absl::StrCat(base, "/", object, query.empty() ? "" : "?", query);
}

struct Sink {
  char* dst = nullptr;
  uint64_t cap = 0, len = 0;
  std::string text;
  std::string etag;
};
size_t WriteCb(char* p, size_t s, size_t n, void* arg) {
  auto* k = static_cast<Sink*>(arg);
  if (k->dst) {
    if (k->len + s * n > k->cap) return 0;
    std::memcpy(k->dst + k->len, p, s * n);
  } else {
    k->text.append(p, s * n);
  }
  k->len += s * n;
  return s * n;
}
size_t HeaderCb(char* p, size_t s, size_t n, void* arg) {
  std::string line(p, s * n);
  if (line.size() > 5 && strncasecmp(line.c_str(), "etag:", 5) == 0) {
    std::string v = line.substr(5);
    v.erase(0, v.find_first_not_of(" \t"));
    v.erase(v.find_last_not_of("\r\n \t") + 1);
    static_cast<Sink*>(arg)->etag = v;
  }
  return s * n;
}

// One request; body (may be null) sent from memory. Returns an error
// naming the URL, or OK with the reply in *sink.
absl::Status Do(CURL* c, const ObjectStoreOptions& o, const char* method,
                const std::string& url, const char* body, uint64_t body_len,
                const std::string& range, Sink* sink) {
  curl_easy_reset(c);
  std::string sig = absl::StrCat("aws:amz:", o.region, ":s3");
  std::string userpwd =
      o.credentials.access_key_id + ":" + o.credentials.secret_access_key;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sig.c_str());
  curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L << 10);
  curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, 2L << 20);
  curl_easy_setopt(c, CURLOPT_EXPECT_100_TIMEOUT_MS, 200L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &WriteCb);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &HeaderCb);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, sink);
  if (body != nullptr || std::strcmp(method, "POST") == 0) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(body_len));
  }
  curl_slist* h =
      curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!range.empty())
    h = curl_slist_append(h, ("Range: bytes=" + range).c_str());
  if (!o.credentials.session_token.empty())
    h = curl_slist_append(
        h, ("x-amz-security-token: " + o.credentials.session_token).c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(h);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK || status / 100 != 2)
    return absl::UnavailableError(
        absl::StrCat("raw ", method, " ", url, " (bucket ", o.bucket,
                     "): ", curl_easy_strerror(rc), " HTTP ", status));
  return absl::OkStatus();
}

// Runs fn(i) for i in [0, n) on `threads` threads, each with its own
// handle (kept across its requests, as a connection pool would).
absl::Status Parallel(uint64_t n, unsigned threads,
                      const std::function<absl::Status(CURL*, uint64_t)>& fn) {
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  absl::Status first;
  auto work = [&] {
    Easy e;
    for (uint64_t i = next++; i < n; i = next++) {
      absl::Status s = fn(e.curl, i);
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = s;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::max(1u, std::min<unsigned>(threads, n)); ++t)
    pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  return first;
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

absl::StatusOr<double> RawObjectPut(const ObjectStoreOptions& o,
                                    const std::string& key, const char* buf,
                                    uint64_t bytes) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  Easy e;
  Sink sink;
  const auto t0 = std::chrono::steady_clock::now();
  if (bytes <= o.part_size) {
    absl::Status s =
        Do(e.curl, o, "PUT", Url(o, key, ""), buf, bytes, "", &sink);
    if (!s.ok()) return s;
    return Since(t0);
  }
  absl::Status s =
      Do(e.curl, o, "POST", Url(o, key, "uploads="), nullptr, 0, "", &sink);
  if (!s.ok()) return s;
  size_t a = sink.text.find("<UploadId>"), b = sink.text.find("</UploadId>");
  if (a == std::string::npos || b == std::string::npos)
    return absl::DataLossError("raw PUT " + key + ": no UploadId in the reply");
  const std::string id(sink.text.substr(a + 10, b - a - 10));
  const uint64_t parts = (bytes + o.part_size - 1) / o.part_size;
  std::vector<std::string> etags(parts);
  s = Parallel(parts, o.concurrency, [&](CURL* c, uint64_t p) {
    Sink k;
    uint64_t off = p * o.part_size, len = std::min(o.part_size, bytes - off);
    absl::Status r =
        Do(c, o, "PUT",
           Url(o, key, absl::StrCat("partNumber=", p + 1, "&uploadId=", id)),
           buf + off, len, "", &k);
    etags[p] = k.etag;
    return r;
  });
  if (!s.ok()) return s;
  std::string xml = "<CompleteMultipartUpload>";
  for (uint64_t p = 0; p < parts; ++p)
    absl::StrAppend(&xml, "<Part><PartNumber>", p + 1, "</PartNumber><ETag>",
                    etags[p], "</ETag></Part>");
  xml += "</CompleteMultipartUpload>";
  Sink done;
  s = Do(e.curl, o, "POST", Url(o, key, "uploadId=" + id), xml.data(),
         xml.size(), "", &done);
  if (!s.ok()) return s;
  return Since(t0);
}

absl::StatusOr<double> RawObjectGet(const ObjectStoreOptions& o,
                                    const std::string& key, char* buf,
                                    uint64_t bytes) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const uint64_t pieces = (bytes + o.part_size - 1) / o.part_size;
  const std::string url = Url(o, key, "");
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status s = Parallel(pieces, o.concurrency, [&](CURL* c, uint64_t p) {
    uint64_t off = p * o.part_size, len = std::min(o.part_size, bytes - off);
    Sink k;
    k.dst = buf + off;
    k.cap = len;
    absl::Status r = Do(c, o, "GET", url, nullptr, 0,
                        absl::StrCat(off, "-", off + len - 1), &k);
    if (r.ok() && k.len != len)
      return absl::DataLossError(
          absl::StrCat("raw GET ", url, ": ", k.len, " of ", len, " bytes"));
    return r;
  });
  if (!s.ok()) return s;
  return Since(t0);
}

}  // namespace ckpt::bench
