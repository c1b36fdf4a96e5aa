// Retry classification, decided once for the whole tree: which failed
// calls are worth making again. Two questions, two answers:
//
// IsUnreachable: the peer did not answer (UNAVAILABLE, DEADLINE_EXCEEDED).
// A client with several endpoints (the coordinator's replicas, etcd's
// members) tries the next one, and a caller may tell its user the peer is
// unreachable.
//
// IsTransient: the same call may succeed later, unchanged: the peer was
// unreachable, or it answered RESOURCE_EXHAUSTED. Every RESOURCE_EXHAUSTED
// our peers send is load shedding: the coordinator's admission limit and
// gRPC's thread quota ("retry with backoff", coordinator/service.h), etcd's
// "too many requests", an object store's 429 (storage/object_http.cc maps
// it to UNAVAILABLE). A permanent one (a request over the peer's size
// limit, a full etcd) then costs retries until the caller's budget or
// backoff ends, never a dropped report; treating shedding as final would
// drop work exactly when a peer is busiest. It is not a reason to fail
// over: another replica of a busy leader only points back at it, and the
// extra calls add to the load being shed.
//
// Everything else (INVALID_ARGUMENT, FAILED_PRECONDITION, PERMISSION_DENIED,
// NOT_FOUND, DATA_LOSS, ABORTED, INTERNAL, ...) is an answer: retrying the
// same call cannot change it. Functions only; thread-safe.
#ifndef CKPT_UTIL_RETRY_H_
#define CKPT_UTIL_RETRY_H_

#include <chrono>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

bool IsUnreachable(absl::StatusCode code);
bool IsTransient(absl::StatusCode code);

inline bool IsUnreachable(const absl::Status& s) {
  return IsUnreachable(s.code());
}
inline bool IsTransient(const absl::Status& s) { return IsTransient(s.code()); }

// The wait a RESOURCE_EXHAUSTED refusal asks for, in milliseconds: the
// coordinator jitters it to spread the refused callers, and says it in
// the "ckpt-retry-after-ms" trailer and in the message ("... retry after
// N ms", read here, for callers whose channel keeps no trailers). -1 when
// it says none (another code, or an older coordinator); at most 60 s.
int RetryAfterMs(absl::StatusCode code, std::string_view message);
template <typename GrpcStatus>
requires requires(const GrpcStatus& s) { s.error_code(); }
int RetryAfterMs(const GrpcStatus& s) {
  return RetryAfterMs(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

// A uniform draw in [lo_ms, hi_ms] (hi_ms below lo_ms counts as lo_ms),
// from a generator per thread seeded by the OS: processes started together
// (a cluster's agents after a failover) must not draw alike, or the herd
// they are meant to spread comes back at once.
std::chrono::milliseconds JitterMs(int64_t lo_ms, int64_t hi_ms);
// Full jitter: uniform in [0, min(max_ms, base_ms * 2^attempt)].
std::chrono::milliseconds FullJitterBackoff(int64_t base_ms, int64_t max_ms,
                                            unsigned attempt);

// grpc::Status, whose codes are numbered as absl's (util does not depend on
// gRPC).
template <typename GrpcStatus>
requires requires(const GrpcStatus& s) { s.error_code(); }
bool IsUnreachable(const GrpcStatus& s) {
  return IsUnreachable(static_cast<absl::StatusCode>(s.error_code()));
}
template <typename GrpcStatus>
requires requires(const GrpcStatus& s) { s.error_code(); }
bool IsTransient(const GrpcStatus& s) {
  return IsTransient(static_cast<absl::StatusCode>(s.error_code()));
}

}  // namespace ckpt

#endif  // CKPT_UTIL_RETRY_H_
