#include "client/file_restore.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/tensor_check.h"
#include "util/checksum.h"
#include "util/status.h"
#ifdef CKPT_HAVE_CUDA
#include "client/cuda_copier.h"
#endif

namespace ckpt::client {
namespace {

constexpr uint64_t kAlign = 4096;
// A gap between wanted pieces up to this size is read through rather than
// split into two reads.
constexpr uint64_t kMaxGap = 1 << 20;
// Reader threads, each with its own requests in flight, so the device stays
// busy while one of them waits for the last request of its chunk.
constexpr size_t kReaders = 4;
// Chunks read straight into tensors need no bounce buffer: readers may run
// this far ahead of the hashing.
constexpr size_t kDirectWindow = 8;

absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }
uint64_t AlignDown(uint64_t x) { return x / kAlign * kAlign; }
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

absl::Status MatchIndex(const v1::OpenRestoreResponse& resp,
                        std::span<const Tensor> tensors,
                        std::vector<const v1::TensorMeta*>* metas) {
  std::unordered_map<std::string_view, const v1::TensorMeta*> index;
  index.reserve(resp.tensors_size());
  for (const v1::TensorMeta& m : resp.tensors()) index.emplace(m.name(), &m);
  metas->assign(tensors.size(), nullptr);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const std::string label = TensorLabel(tensors, i);
    auto it = index.find(t.name);
    if (it == index.end())
      return absl::NotFoundError(
          absl::StrCat(label, ": not in the checkpoint"));
    const v1::TensorMeta& m = *it->second;
    if (m.dtype() != static_cast<uint32_t>(t.dtype))
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": dtype is ", AV(DTypeName(t.dtype)), ", the checkpoint has ",
          AV(DTypeName(static_cast<DType>(m.dtype())))));
    bool same_shape = static_cast<size_t>(m.shape_size()) == t.shape.size();
    for (size_t d = 0; same_shape && d < t.shape.size(); ++d)
      same_shape =
          m.shape(static_cast<int>(d)) == static_cast<uint64_t>(t.shape[d]);
    if (!same_shape)
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": shape is [", absl::StrJoin(t.shape, ","),
          "], the checkpoint has [", absl::StrJoin(m.shape(), ","), "]"));
    if (m.bytes() != *t.bytes())
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", *t.bytes(), " bytes, the checkpoint has ", m.bytes()));
    if (m.offset() > resp.image_bytes() ||
        resp.image_bytes() - m.offset() < m.bytes())
      return absl::DataLossError(absl::StrCat(
          label, ": offset ", m.offset(), " + ", m.bytes(),
          " bytes exceed the image of ", resp.image_bytes(), " bytes"));
    (*metas)[i] = &m;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardFileUsable(const std::string& path,
                                     uint64_t image_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == EACCES || errno == EPERM || errno == ENOENT) return false;
    return ErrnoToStatus(errno, absl::StrCat("open ", path));
  }
  struct stat st;
  int ret = ::fstat(fd, &st);
  int err = errno;
  ::close(fd);
  if (ret != 0) return ErrnoToStatus(err, absl::StrCat("fstat ", path));
  if (!S_ISREG(st.st_mode))
    return absl::InternalError(absl::StrCat(path, ": not a regular file"));
  return static_cast<uint64_t>(st.st_size) == image_bytes;
}

FileRestorer::FileRestorer(CopyEngine* engine, bool cuda_device)
    : engine_(engine), cuda_device_(cuda_device) {}

FileRestorer::~FileRestorer() {
  if (buffers_ == nullptr) return;
  if (backend_) backend_->UnregisterMemory(buffers_);
  backend_.reset();
#ifdef CKPT_HAVE_CUDA
  if (pinned_) (void)CudaCopier::Unpin(buffers_);
#endif
  ::munmap(buffers_, kBounceBuffers * kBounceBytes);
}

absl::Status FileRestorer::EnsureBuffersLocked() {
  if (buffers_ != nullptr) return absl::OkStatus();
  const uint64_t bytes = kBounceBuffers * kBounceBytes;
  // Page-aligned and pre-faulted, so neither O_DIRECT nor the first restore
  // pays for page faults.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return ErrnoToStatus(
        errno, absl::StrCat("restore: map ", bytes, " bytes of read buffers"));
  buffers_ = static_cast<char*>(p);
#ifdef CKPT_HAVE_CUDA
  if (cuda_device_) {
    CKPT_RETURN_IF_ERROR(Annotate(CudaCopier::Pin(buffers_, bytes),
                                  "restore: pin the read buffers"));
    pinned_ = true;
  }
#endif
  return absl::OkStatus();
}

absl::Status FileRestorer::EnsureBackendLocked(const std::string& dir) {
  if (backend_ && backend_root_ == dir) return absl::OkStatus();
  if (backend_) backend_->UnregisterMemory(buffers_);
  backend_.reset();
  storage::LocalBackendOptions o;
  o.root = dir;
  o.remove_tmp_files = false;  // the daemon owns the directory
  o.sync = false;
  CKPT_ASSIGN_OR_RETURN(backend_, storage::NewLocalBackend(std::move(o)));
  backend_root_ = dir;
  // Registered buffers only spare the kernel a page walk per request; a
  // refusal (memlock limit) leaves plain reads, which work as well.
  if (!backend_->RegisterMemory(buffers_, kBounceBuffers * kBounceBytes).ok())
    backend_->UnregisterMemory(buffers_);
  return absl::OkStatus();
}

absl::Status FileRestorer::Restore(
    const std::string& path, uint64_t image_bytes,
    std::span<const Tensor> tensors,
    std::span<const v1::TensorMeta* const> metas) {
  const size_t slash = path.rfind('/');
  if (path.empty() || path[0] != '/' || slash == path.size() - 1)
    return absl::InternalError(absl::StrCat(
        "OpenRestore: path \"", path, "\" is not an absolute file path"));
  const std::string dir = slash == 0 ? "/" : path.substr(0, slash);
  const std::string key = path.substr(slash + 1);

  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(EnsureBuffersLocked());
  CKPT_RETURN_IF_ERROR(EnsureBackendLocked(dir));

  // Plan: pieces in file order, grouped into chunks of whole pieces.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return metas[a]->offset() < metas[b]->offset();
  });
  std::vector<size_t> first_hash(tensors.size());
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    first_hash[i] = total;
    total += ChecksumChunks(metas[i]->bytes());
  }
  hashes_.assign(total, 0);
  pieces_.clear();
  for (size_t i : order) {
    const uint64_t n = metas[i]->bytes();
    for (uint64_t off = 0, k = 0; off < n; off += kChecksumChunk, ++k)
      pieces_.push_back({i, metas[i]->offset() + off,
                         std::min<uint64_t>(kChecksumChunk, n - off), off,
                         first_hash[i] + k});
  }
  chunks_.clear();
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const Piece& pc = pieces_[p];
    const Tensor& t = tensors[pc.tensor];
    // A host tensor at a 4 KiB-aligned address takes O_DIRECT reads of its
    // own bytes: no bounce buffer, no copy, only the hash pass.
    char* direct = t.device.is_host() &&
                           reinterpret_cast<uintptr_t>(t.data) % kAlign == 0
                       ? static_cast<char*>(t.data) + pc.dst_offset
                       : nullptr;
    if (!chunks_.empty()) {
      Chunk& c = chunks_.back();
      const uint64_t c_end = c.offset + c.len;
      if (direct != nullptr) {
        if (c.direct != nullptr && pieces_[c.first_piece].tensor == pc.tensor &&
            pc.offset == c_end && c.len + pc.bytes <= kBounceBytes) {
          c.len += pc.bytes;
          c.end_piece = p + 1;
          continue;
        }
      } else {
        const uint64_t end = std::min(AlignUp(pc.offset + pc.bytes), image_bytes);
        if (c.direct == nullptr && pc.offset <= c_end + kMaxGap &&
            std::max(end, c_end) - c.offset <= kBounceBytes) {
          c.len = std::max(end, c_end) - c.offset;
          c.end_piece = p + 1;
          continue;
        }
      }
    }
    if (direct != nullptr) {
      chunks_.push_back({pc.offset, pc.bytes, p, p + 1, direct});
    } else {
      const uint64_t start = AlignDown(pc.offset);
      const uint64_t end = std::min(AlignUp(pc.offset + pc.bytes), image_bytes);
      chunks_.push_back({start, end - start, p, p + 1, nullptr});
    }
  }

  // Reader c % kReaders fills buffer c % kBounceBuffers with chunk c once
  // chunk c - kBounceBuffers has been copied out of it; chunks are copied in
  // order.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> read(chunks_.size(), 0);
  size_t copied = 0;
  bool abort = false;
  absl::Status read_status;
  auto read_loop = [&](size_t first) {
    for (size_t c = first; c < chunks_.size(); c += kReaders) {
      {
        std::unique_lock<std::mutex> l(mu);
        const size_t window = chunks_[c].direct != nullptr
                                  ? kDirectWindow
                                  : static_cast<size_t>(kBounceBuffers);
        cv.wait(l, [&] { return abort || c - copied < window; });
        if (abort) return;
      }
      char* buf = chunks_[c].direct != nullptr
                      ? chunks_[c].direct
                      : buffers_ + (c % kBounceBuffers) * kBounceBytes;
      absl::Status s =
          backend_->ReadAt(key, chunks_[c].offset, buf, chunks_[c].len);
      std::lock_guard<std::mutex> l(mu);
      if (!s.ok()) {
        read_status = s;
        abort = true;
        cv.notify_all();
        return;
      }
      read[c] = 1;
      cv.notify_all();
    }
  };
  std::thread readers[kReaders];
  for (size_t r = 0; r < kReaders; ++r) readers[r] = std::thread(read_loop, r);
  absl::Status s;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return abort || read[c]; });
      if (abort) break;
    }
    s = CopyChunk(chunks_[c],
                  chunks_[c].direct != nullptr
                      ? chunks_[c].direct
                      : buffers_ + (c % kBounceBuffers) * kBounceBytes,
                  tensors);
    std::lock_guard<std::mutex> l(mu);
    if (!s.ok()) abort = true;
    copied = c + 1;
    cv.notify_all();
    if (!s.ok()) break;
  }
  for (std::thread& t : readers) t.join();
  if (!read_status.ok())
    return absl::DataLossError(absl::StrCat("read of shard file ", path, ": ",
                                            read_status.message()));
  CKPT_RETURN_IF_ERROR(s);

  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t sum = CombineChunkHashes(std::span<const uint64_t>(hashes_)
        .subspan(first_hash[i], ChecksumChunks(metas[i]->bytes())));
    if (metas[i]->has_checksum() && metas[i]->checksum() != sum)
      return absl::DataLossError(absl::StrFormat(
          "%s: checksum mismatch (stored %016x, computed %016x) in %s",
          TensorLabel(tensors, i), metas[i]->checksum(), sum, path));
  }
  return absl::OkStatus();
}

absl::Status FileRestorer::CopyChunk(const Chunk& c, const char* buf,
                                     std::span<const Tensor> tensors) {
  regions_.clear();
  for (size_t p = c.first_piece; p < c.end_piece; ++p) {
    const Piece& pc = pieces_[p];
    const Tensor& t = tensors[pc.tensor];
    char* dst = t.device.is_host() && c.direct == nullptr
                    ? static_cast<char*>(t.data) + pc.dst_offset
                    : nullptr;  // device pieces, and direct reads: hash only
    regions_.push_back({buf + (pc.offset - c.offset), dst, pc.bytes});
  }
  absl::Status s;
#ifdef CKPT_HAVE_CUDA
  // Device pieces go by DMA while the engine hashes their bounce bytes; the
  // buffer is reused only after Wait().
  CudaCopier cuda;
  for (size_t p = c.first_piece; p < c.end_piece && s.ok(); ++p) {
    const Piece& pc = pieces_[p];
    const Tensor& t = tensors[pc.tensor];
    if (t.device.is_host()) continue;
    s = cuda.EnqueueToDevice(t.device.index,
                             static_cast<char*>(t.data) + pc.dst_offset,
                             regions_[p - c.first_piece].src, pc.bytes);
    if (!s.ok()) s = Annotate(s, TensorLabel(tensors, pc.tensor));
  }
#endif
  region_hashes_.resize(regions_.size());
  if (s.ok()) engine_->RunPieces(regions_, region_hashes_);
#ifdef CKPT_HAVE_CUDA
  absl::Status w = cuda.Wait();
  if (s.ok() && !w.ok()) s = Annotate(w, "restore: device copies");
#endif
  CKPT_RETURN_IF_ERROR(s);
  for (size_t p = c.first_piece; p < c.end_piece; ++p)
    hashes_[pieces_[p].hash_index] = region_hashes_[p - c.first_piece];
  return absl::OkStatus();
}

}  // namespace ckpt::client
