// The machine's limits that ckpt_bench compares ckptd against, each measured
// the plain way: a multi-threaded memcpy into a buffer already faulted in
// (bench/huge_buffer.h: the page size ckptd's own memory gets),
// write()+fsync of every tensor to one file (what torch.save does), and
// sequential O_DIRECT writes and reads through io_uring with several
// requests in flight (the device limit). Every function returns elapsed
// seconds or a Status naming the path. Not thread-safe (each runs its own
// threads or ring).
#ifndef CKPT_BENCH_RAW_IO_H_
#define CKPT_BENCH_RAW_IO_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt::bench {

// Copies every tensor into dst (packed, in order) with `threads` threads
// splitting the total bytes evenly. dst must hold the sum of the sizes.
double ParallelMemcpy(char* dst, std::span<const Tensor> tensors, int threads);

// write() of each tensor to a new file at path, then fsync, then close.
[[nodiscard]] absl::StatusOr<double> SyncWrite(const std::string& path,
                                               std::span<const Tensor> tensors);

struct RawIoOptions {
  unsigned depth = 8;           // requests in flight
  uint64_t io_bytes = 4 << 20;  // bytes per request
};
// O_DIRECT sequential write of [buf, buf+bytes) to a new, fallocated file
// at path, then fsync. buf and bytes must be 4096-aligned.
[[nodiscard]] absl::StatusOr<double> RawWrite(const std::string& path,
                                              const char* buf, uint64_t bytes,
                                              const RawIoOptions& options);
// O_DIRECT sequential read of the first `bytes` of path into buf.
[[nodiscard]] absl::StatusOr<double> RawRead(const std::string& path, char* buf,
                                             uint64_t bytes,
                                             const RawIoOptions& options);

// Asks the kernel to drop the file's cached pages (posix_fadvise DONTNEED,
// after an fdatasync so dirty pages can go).
[[nodiscard]] absl::Status DropFileCache(const std::string& path);

// The network's limit: `bytes` from `data` over one plain loopback TCP
// connection (2 MiB writes) into `sink`; seconds until the receiver has
// every byte. The receiver listens on `port` (0: any free port; a fixed one
// lets a traffic shaper match it, recovery_bench --link-gbit).
[[nodiscard]] absl::StatusOr<double> RawTcpTransfer(const char* data,
                                                    uint64_t bytes, char* sink,
                                                    int port = 0);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_RAW_IO_H_
