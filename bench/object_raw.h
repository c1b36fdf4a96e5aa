// The object store's limits that the benchmarks compare ObjectBackend
// against, measured the plain way with libcurl and nothing of ours in the
// path: one multipart upload of N bytes from memory with `concurrency` parts
// in flight (no checksum, no retries), and a parallel ranged GET of an
// object into memory with the same concurrency. Same signing (SigV4), same
// server, same part size: the ratio ours/raw is our overhead. Each returns
// elapsed seconds or a Status naming endpoint, bucket and key. Not
// thread-safe (each runs its own threads).
#ifndef CKPT_BENCH_OBJECT_RAW_H_
#define CKPT_BENCH_OBJECT_RAW_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "storage/object_backend.h"

namespace ckpt::bench {

// Uploads [buf, buf+bytes) to object "<options.prefix>/<key>" as a multipart
// upload of options.part_size parts, options.concurrency in flight (one PUT
// when bytes <= part_size).
[[nodiscard]] absl::StatusOr<double> RawObjectPut(
    const storage::ObjectStoreOptions& options, const std::string& key,
    const char* buf, uint64_t bytes);
// Reads the first `bytes` of "<options.prefix>/<key>" into buf with ranged
// GETs of options.part_size, options.concurrency in flight.
[[nodiscard]] absl::StatusOr<double> RawObjectGet(
    const storage::ObjectStoreOptions& options, const std::string& key,
    char* buf, uint64_t bytes);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_OBJECT_RAW_H_
