// storage::Backend on an S3-compatible object store (AWS S3, MinIO, Ceph
// RGW, s3rver), over libcurl with its built-in SigV4 signing
// (CURLOPT_AWS_SIGV4). A URL becomes a Backend through OpenBackend
// (storage/open_backend.h), the one factory.
//
// Keys map to object names "<prefix>/<key>" (prefix may be empty), so a
// step's objects are "<prefix>/<job>/step-<N>/rank-<R>.shard" and
// ".../MANIFEST" (storage/keys.h). A store has no rename and no fsync: an
// object becomes visible when its upload completes (ObjectWriter::Commit),
// and a step becomes visible only through its manifest, written last by the
// daemon (doc/object-storage.md).
//
// Writer: a multipart upload straight from the caller's memory (curl read
// callbacks over the bytes given to WriteAt, no intermediate copy), with up
// to `concurrency` parts of `part_size` bytes in flight as soon as each
// part's bytes have all been given; an object no larger than one part is a
// single PUT at Commit. Every tensor's XXH3 in the shard is verified on
// read; with verify_part_md5, each part's MD5 is also computed while it is
// sent and compared with the ETag the store returns. A failed upload is aborted
// (AbortMultipartUpload): no orphaned parts. Reader: parallel ranged GETs
// into the caller's buffer. Every request is retried with exponential
// backoff and full jitter on 5xx, 429/SlowDown, timeouts, stalls and
// connection resets, within max_attempts and retry_budget; then the error
// names endpoint, bucket and key. A reply is validated (status, length,
// XML fields); an object shorter than asked is DataLoss naming the key.
//
// Credentials never come from a flag: AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, else a credentials file
// (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, profile AWS_PROFILE or
// "default"). Endpoint and region: config keys, else AWS_ENDPOINT_URL /
// AWS_REGION (AWS_DEFAULT_REGION), else https://s3.<region>.amazonaws.com.
//
// Thread-safety: as backend.h (the Backend is safe for concurrent use; a
// writer or reader is used by one thread at a time). Functions here are
// thread-safe.
#ifndef CKPT_STORAGE_OBJECT_BACKEND_H_
#define CKPT_STORAGE_OBJECT_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/backend.h"

namespace ckpt::storage {

inline constexpr std::string_view kObjectUrlScheme = "s3://";

struct ObjectCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // optional (temporary credentials)
};

enum class ObjectAddressing {
  kPath,         // <endpoint>/<bucket>/<object>  (MinIO, s3rver, Ceph)
  kVirtualHost,  // <scheme>://<bucket>.<endpoint host>/<object>  (AWS)
};

// Everything an ObjectBackend needs, resolved (ResolveObjectStoreOptions).
struct ObjectStoreOptions {
  std::string endpoint;  // "http://127.0.0.1:9000" (scheme://host[:port])
  std::string bucket;
  std::string prefix;  // "" or "a/b" (no leading or trailing '/')
  std::string region = "us-east-1";
  ObjectAddressing addressing = ObjectAddressing::kPath;
  ObjectCredentials credentials;

  uint64_t part_size = 16 << 20;  // multipart part size (>= 5 MiB)
  unsigned concurrency = 8;       // requests in flight per writer / ReadAt
  // Compare each part's MD5 (computed as it is sent) with its ETag. Off by
  // default: it costs ~1.7 CPU-s per GiB, and measured on a loopback store
  // it halved the upload rate; shards carry per-tensor XXH3 checked on read.
  bool verify_part_md5 = false;

  unsigned max_attempts = 6;         // per request, first try included
  uint32_t retry_budget_ms = 60000;  // total time one request may retry
  uint32_t backoff_base_ms = 100;    // first backoff (then x2, capped)
  uint32_t backoff_max_ms = 5000;
  uint32_t connect_timeout_ms = 5000;
  // A transfer that moves no byte for this long is a stall: cancelled and
  // retried (curl's low-speed limit).
  uint32_t stall_timeout_ms = 15000;
  unsigned list_page_size = 1000;  // ListObjectsV2 max-keys (1..1000)
};

// What the config file may set (flat TOML keys "object_endpoint", ...;
// ReadObjectStoreConfig). Unset fields come from the environment or the
// defaults above. Nothing here is a secret: credentials come only from the
// environment or the credentials file.
struct ObjectStoreConfig {
  std::optional<std::string> endpoint;  // object_endpoint
  std::optional<std::string> region;    // object_region
  std::optional<std::string>
      addressing;  // object_addressing: "path" | "virtual"
  std::optional<uint64_t> part_size_mib;        // object_part_mib
  std::optional<unsigned> concurrency;          // object_concurrency
  std::optional<bool> verify_part_md5;          // object_verify_md5
  std::optional<unsigned> max_attempts;         // object_max_attempts
  std::optional<uint32_t> retry_budget_ms;      // object_retry_budget_ms
  std::optional<uint32_t> connect_timeout_ms;   // object_connect_timeout_ms
  std::optional<uint32_t> stall_timeout_ms;     // object_stall_timeout_ms
  std::optional<std::string> credentials_file;  // object_credentials_file
  std::optional<std::string> profile;           // object_profile
};

// (ReadObjectStoreConfig, which reads these keys from a TOML table, is in
// storage/object_config.h so this header does not pull toml++ in.)

// True when s starts with "s3://".
bool IsObjectUrl(std::string_view s);

struct ObjectUrl {
  std::string bucket;
  std::string prefix;  // without leading or trailing '/'
};
// "s3://bucket[/prefix]": bucket 3..63 of [a-z0-9.-]; prefix components of
// [A-Za-z0-9._-] (no "." or ".."). InvalidArgument naming `field`.
[[nodiscard]] absl::StatusOr<ObjectUrl> ParseObjectUrl(
    std::string_view url, std::string_view field = "url");

// Looks up an environment variable (tests pass their own).
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
std::optional<std::string> ProcessEnv(const char* name);

// url + config + environment (+ credentials file) -> options; validates
// every field (InvalidArgument naming it; a missing access key is
// FailedPrecondition saying where credentials are looked for).
[[nodiscard]] absl::StatusOr<ObjectStoreOptions> ResolveObjectStoreOptions(
    std::string_view url, const ObjectStoreConfig& config,
    const EnvLookup& env = ProcessEnv);

// Validates options (InvalidArgument naming the field) and returns the
// backend; nothing is sent until the first call. name() is "s3".
[[nodiscard]] absl::StatusOr<std::unique_ptr<Backend>> NewObjectBackend(
    ObjectStoreOptions options);

// Object-store counters beyond BackendStats (requests and retries by
// kind), for metrics and the fault tests. All zero on other backends.
struct ObjectStoreStats {
  uint64_t requests = 0;  // HTTP requests sent, retries included
  uint64_t retries = 0;   // requests that were retries
  uint64_t aborted_uploads = 0;
};
ObjectStoreStats GetObjectStoreStats(const Backend& backend);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_OBJECT_BACKEND_H_
