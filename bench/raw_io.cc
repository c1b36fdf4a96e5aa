#include "bench/raw_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <liburing.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/stats.h"
#include "util/status.h"

namespace ckpt::bench {
namespace {

struct Piece {
  uint64_t off;
  uint64_t len;
};

// The liburing io_uring-cp loop: keep `depth` requests in flight, re-queue
// short transfers, resubmit on -EAGAIN/-EINTR.
absl::Status RunRing(int fd, char* buf, uint64_t bytes, bool write,
                     const RawIoOptions& o, const std::string& path) {
  io_uring ring;
  int ret = io_uring_queue_init(o.depth, &ring, 0);
  if (ret < 0) return ErrnoToStatus(-ret, "io_uring_queue_init for " + path);
  std::deque<Piece> queued;
  for (uint64_t off = 0; off < bytes; off += o.io_bytes)
    queued.push_back({off, std::min(o.io_bytes, bytes - off)});
  std::vector<Piece> slots(o.depth);
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < o.depth; ++i) free_slots.push_back(i);
  unsigned inflight = 0;
  absl::Status status;
  while (status.ok() && (!queued.empty() || inflight > 0)) {
    while (!queued.empty() && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) break;
      unsigned slot = free_slots.back();
      free_slots.pop_back();
      slots[slot] = queued.front();
      queued.pop_front();
      const Piece& p = slots[slot];
      if (write)
        io_uring_prep_write(sqe, fd, buf + p.off, static_cast<unsigned>(p.len),
                            p.off);
      else
        io_uring_prep_read(sqe, fd, buf + p.off, static_cast<unsigned>(p.len),
                           p.off);
      io_uring_sqe_set_data64(sqe, slot);
      ++inflight;
    }
    ret = io_uring_submit(&ring);
    if (ret < 0 && ret != -EINTR && ret != -EAGAIN) {
      status = ErrnoToStatus(-ret, "io_uring_submit for " + path);
      break;
    }
    io_uring_cqe* cqe = nullptr;
    ret = io_uring_wait_cqe(&ring, &cqe);
    if (ret == -EINTR) continue;
    if (ret < 0) {
      status = ErrnoToStatus(-ret, "io_uring_wait_cqe for " + path);
      break;
    }
    do {
      unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      Piece p = slots[slot];
      int res = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      --inflight;
      free_slots.push_back(slot);
      if (res == -EAGAIN || res == -EINTR) {
        queued.push_front(p);
      } else if (res < 0) {
        status = ErrnoToStatus(-res, absl::StrCat(write ? "write " : "read ",
                                                  path, " at ", p.off));
      } else if (res == 0) {
        status = absl::DataLossError(
            absl::StrCat(path, ": unexpected end of file at ", p.off));
      } else if (static_cast<uint64_t>(res) < p.len) {
        queued.push_front({p.off + static_cast<uint64_t>(res),
                           p.len - static_cast<uint64_t>(res)});
      }
    } while (io_uring_peek_cqe(&ring, &cqe) == 0);
  }
  // Reap what is still in flight before the ring goes away.
  while (inflight > 0) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) != 0) break;
    io_uring_cqe_seen(&ring, cqe);
    --inflight;
  }
  io_uring_queue_exit(&ring);
  return status;
}

}  // namespace

double ParallelMemcpy(char* dst, std::span<const Tensor> tensors, int threads) {
  // Global byte ranges [begin, end) per thread, mapped back onto tensors.
  uint64_t total = 0;
  for (const Tensor& t : tensors) total += t.bytes().value_or(0);
  auto copy_range = [&](uint64_t begin, uint64_t end) {
    uint64_t base = 0;
    for (const Tensor& t : tensors) {
      uint64_t n = t.bytes().value_or(0);
      uint64_t lo = std::max(begin, base), hi = std::min(end, base + n);
      if (lo < hi)
        std::memcpy(dst + lo, static_cast<const char*>(t.data) + (lo - base),
                    hi - lo);
      base += n;
    }
  };
  threads = std::max(1, threads);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  uint64_t per = (total / threads + 4095) / 4096 * 4096;
  for (int i = 1; i < threads; ++i)
    pool.emplace_back(copy_range, std::min(total, per * i),
                      std::min(total, per * (i + 1)));
  copy_range(0, std::min(total, per));
  for (auto& th : pool) th.join();
  return Since(t0);
}

absl::StatusOr<double> SyncWrite(const std::string& path,
                                 std::span<const Tensor> tensors) {
  auto t0 = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  absl::Status s;
  for (const Tensor& t : tensors) {
    const char* p = static_cast<const char*>(t.data);
    uint64_t left = t.bytes().value_or(0);
    while (s.ok() && left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        s = ErrnoToStatus(errno, "write " + path);
      else
        p += n, left -= static_cast<uint64_t>(n);
    }
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoToStatus(errno, "fsync " + path);
  ::close(fd);
  if (!s.ok()) return s;
  return Since(t0);
}

absl::StatusOr<double> RawWrite(const std::string& path, const char* buf,
                                uint64_t bytes, const RawIoOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus(errno, "open (O_DIRECT) " + path);
  // Reserve the extent first, as the local backend does: block allocation
  // during the writes is not part of the device limit.
  absl::Status s;
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0 &&
      errno != EOPNOTSUPP)
    s = ErrnoToStatus(errno, "fallocate " + path);
  if (s.ok())
    s = RunRing(fd, const_cast<char*>(buf), bytes, /*write=*/true, options,
                path);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoToStatus(errno, "fsync " + path);
  ::close(fd);
  if (!s.ok()) return s;
  return Since(t0);
}

absl::StatusOr<double> RawRead(const std::string& path, char* buf,
                               uint64_t bytes, const RawIoOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open (O_DIRECT) " + path);
  absl::Status s = RunRing(fd, buf, bytes, /*write=*/false, options, path);
  ::close(fd);
  if (!s.ok()) return s;
  return Since(t0);
}

absl::Status DropFileCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  absl::Status s;
  if (::fdatasync(fd) != 0) s = ErrnoToStatus(errno, "fdatasync " + path);
  int err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (s.ok() && err != 0)
    s = ErrnoToStatus(err, "posix_fadvise(DONTNEED) " + path);
  ::close(fd);
  return s;
}

absl::StatusOr<double> RawTcpTransfer(const char* data, uint64_t bytes,
                                      char* sink, int port) {
  const int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof a;
  const int one = 1;
  if (ls >= 0) setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    absl::Status s = absl::InternalError(
        absl::StrCat("loopback listener: ", std::strerror(errno)));
    if (ls >= 0) close(ls);
    return s;
  }
  bool received = false;
  std::thread rx([&] {
    const int c = accept(ls, nullptr, nullptr);
    uint64_t got = 0;
    while (c >= 0 && got < bytes) {
      const ssize_t n = read(c, sink + got, bytes - got);
      if (n <= 0 && errno != EINTR) break;
      if (n > 0) got += static_cast<uint64_t>(n);
    }
    received = got == bytes;
    const char ok = 1;
    if (c >= 0) {
      (void)!write(c, &ok, 1);
      close(c);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  bool sent =
      s >= 0 && connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  for (uint64_t off = 0; sent && off < bytes;) {
    const ssize_t w =
        write(s, data + off, std::min<uint64_t>(2 << 20, bytes - off));
    if (w <= 0 && errno != EINTR) sent = false;
    if (w > 0) off += static_cast<uint64_t>(w);
  }
  char ok = 0;
  if (sent && read(s, &ok, 1) != 1) sent = false;
  const double secs = Since(t0);
  if (s >= 0) shutdown(s, SHUT_RDWR);
  shutdown(ls, SHUT_RDWR);  // a receiver still in accept() gives up
  rx.join();
  if (s >= 0) close(s);
  close(ls);
  if (!sent || !received)
    return absl::InternalError("loopback TCP transfer broke off");
  return secs;
}

}  // namespace ckpt::bench
