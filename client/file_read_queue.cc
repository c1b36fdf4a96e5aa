#include "client/file_read_queue.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::client {
namespace {

constexpr uint64_t kAlign = 4096;

bool Aligned(uint64_t x) { return x % kAlign == 0; }
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

struct FileReadQueue::Ring {
  io_uring ring;
  ~Ring() { io_uring_queue_exit(&ring); }
};

FileReadQueue::FileReadQueue(std::string path, unsigned depth,
                             uint64_t io_bytes)
    : path_(std::move(path)),
      depth_(depth == 0 ? 1 : depth),
      io_bytes_(io_bytes < kAlign ? kAlign : io_bytes / kAlign * kAlign) {}

absl::StatusOr<std::unique_ptr<FileReadQueue>> FileReadQueue::Open(
    const std::string& path, uint64_t file_bytes, unsigned depth,
    uint64_t io_bytes) {
  std::unique_ptr<FileReadQueue> q(new FileReadQueue(path, depth, io_bytes));
  q->buffered_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (q->buffered_fd_ < 0)
    return ErrnoToStatus(errno, absl::StrCat("open shard file ", path));
  struct stat st {};
  if (::fstat(q->buffered_fd_, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("fstat shard file ", path));
  if (!S_ISREG(st.st_mode))
    return absl::DataLossError(
        absl::StrCat("shard file ", path, ": not a regular file"));
  if (static_cast<uint64_t>(st.st_size) != file_bytes)
    return absl::DataLossError(absl::StrCat("shard file ", path, ": ",
                                            st.st_size, " bytes, expected ",
                                            file_bytes));
  // A file system without O_DIRECT (tmpfs) reads everything buffered.
  q->direct_fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  auto ring = std::make_unique<Ring>();
  // A kernel without io_uring (or a seccomp filter) falls back to pread.
  if (io_uring_queue_init(q->depth_, &ring->ring, 0) == 0)
    q->ring_ = std::move(ring);
  q->slots_.resize(q->depth_);
  for (unsigned i = 0; i < q->depth_; ++i) q->free_slots_.push_back(i);
  return q;
}

FileReadQueue::~FileReadQueue() {
  // Buffers must not be written after we return: reap what is in flight.
  while (ring_ && inflight_ > 0) {
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring_->ring, &cqe) != 0) break;
    io_uring_cqe_seen(&ring_->ring, cqe);
    --inflight_;
  }
  ring_.reset();
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (buffered_fd_ >= 0) ::close(buffered_fd_);
}

void FileReadQueue::Add(char* buf, uint64_t offset, uint64_t len, uint64_t room,
                        uint64_t tag) {
  for (uint64_t off = 0; off < len; off += io_bytes_) {
    const uint64_t n = std::min(io_bytes_, len - off);
    // Only the last request may read past its bytes, into the caller's room.
    const uint64_t piece_room = off + n == len ? room - off : n;
    Request r{buf + off, offset + off, n, n, false, tag, n};
    const bool direct_start = direct_fd_ >= 0 &&
                              Aligned(reinterpret_cast<uintptr_t>(r.buf)) &&
                              Aligned(r.offset);
    if (!direct_start) {
      Push(r);
    } else if (Aligned(n) || AlignUp(n) <= piece_room) {
      r.direct = true;
      r.ask = AlignUp(n);
      Push(r);
    } else {
      // Aligned head direct, the tail of a tensor through the page cache.
      const uint64_t head = n / kAlign * kAlign;
      if (head > 0) Push({r.buf, r.offset, head, head, true, tag, head});
      Push({r.buf + head, r.offset + head, n - head, n - head, false, tag,
            n - head});
    }
  }
}

void FileReadQueue::Push(Request r) { pending_.push_back(r); }

bool FileReadQueue::Complete(
    Request r, int res, const std::function<void(uint64_t, uint64_t)>& done) {
  if (res == -EAGAIN || res == -EINTR) {
    pending_.push_front(r);
    return true;
  }
  if (res == -EINVAL && r.direct) {
    // The file system refused this direct read: the page cache serves it.
    r.direct = false;
    r.ask = r.len;
    pending_.push_front(r);
    return true;
  }
  if (res < 0) {
    error_ = ErrnoToStatus(
        -res, absl::StrCat("read shard file ", path_, " at ", r.offset));
    return false;
  }
  if (res == 0) {
    error_ = absl::DataLossError(absl::StrCat(
        "shard file ", path_, ": unexpected end of file at ", r.offset));
    return false;
  }
  const uint64_t got = static_cast<uint64_t>(res);
  if (got >= r.len) {
    done(r.tag, r.report);
    return true;
  }
  r.buf += got;
  r.offset += got;
  r.len -= got;
  r.direct = r.direct && Aligned(reinterpret_cast<uintptr_t>(r.buf)) &&
             Aligned(r.offset);
  r.ask = r.direct ? r.ask - got : r.len;
  pending_.push_front(r);
  return true;
}

absl::Status FileReadQueue::RunSync(
    const std::function<void(uint64_t, uint64_t)>& done) {
  Request r = pending_.front();
  pending_.pop_front();
  ssize_t n = ::pread(r.direct ? direct_fd_ : buffered_fd_, r.buf, r.ask,
                      static_cast<off_t>(r.offset));
  if (!Complete(r, n < 0 ? -errno : static_cast<int>(n), done)) return error_;
  return absl::OkStatus();
}

absl::Status FileReadQueue::Reap(
    const std::function<void(uint64_t tag, uint64_t len)>& done) {
  if (!error_.ok()) return error_;
  if (outstanding() == 0) return absl::OkStatus();
  if (!ring_) return RunSync(done);
  while (!pending_.empty() && !free_slots_.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
    if (sqe == nullptr) break;
    const unsigned slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = pending_.front();
    pending_.pop_front();
    const Request& r = slots_[slot];
    io_uring_prep_read(sqe, r.direct ? direct_fd_ : buffered_fd_, r.buf,
                       static_cast<unsigned>(r.ask), r.offset);
    io_uring_sqe_set_data64(sqe, slot);
    ++inflight_;
  }
  int ret = io_uring_submit(&ring_->ring);
  if (ret < 0 && ret != -EINTR && ret != -EAGAIN) {
    error_ = ErrnoToStatus(-ret, absl::StrCat("io_uring_submit for ", path_));
    return error_;
  }
  io_uring_cqe* cqe = nullptr;
  ret = io_uring_wait_cqe(&ring_->ring, &cqe);
  if (ret == -EINTR) return absl::OkStatus();  // the caller reaps again
  if (ret < 0) {
    error_ = ErrnoToStatus(-ret, absl::StrCat("io_uring_wait_cqe for ", path_));
    return error_;
  }
  do {
    const unsigned slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_->ring, cqe);
    --inflight_;
    free_slots_.push_back(slot);
    if (!Complete(slots_[slot], res, done)) return error_;
  } while (io_uring_peek_cqe(&ring_->ring, &cqe) == 0);
  return absl::OkStatus();
}

}  // namespace ckpt::client
