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
#include "util/strings.h"

namespace ckpt::client {
namespace {

constexpr uint64_t kAlign = 4096;
// A gap between wanted pieces up to this size is read through rather than
// split into two reads.
constexpr uint64_t kMaxGap = 1 << 20;

uint64_t AlignDown(uint64_t x) { return x / kAlign * kAlign; }
uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// A tensor's layout as compared: a whole tensor is offsets 0 of its own
// shape, named by its own name.
TensorLayout Effective(const std::optional<TensorLayout>& layout,
                       const std::vector<int64_t>& shape,
                       const std::string& name) {
  TensorLayout l;
  if (layout && !layout->global_shape.empty()) l = *layout;
  if (l.global_shape.empty()) {
    l.global_shape = shape;
    l.offsets.assign(shape.size(), 0);
  }
  if (l.global_name.empty()) l.global_name = name;
  return l;
}

}  // namespace

std::optional<TensorLayout> SavedLayout(const v1::TensorMeta& meta) {
  if (meta.global_shape_size() == 0) return std::nullopt;
  TensorLayout l;
  for (uint64_t d : meta.global_shape())
    l.global_shape.push_back(static_cast<int64_t>(d));
  for (uint64_t d : meta.piece_offsets())
    l.offsets.push_back(static_cast<int64_t>(d));
  l.global_name = meta.global_name();
  return l;
}

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
    // Another place than the one saved under this name (or the whole of a
    // tensor whose piece this is): a restore into another layout serves it
    // (Client::Impl::Reshardable).
    bool same_shape = static_cast<size_t>(m.shape_size()) == t.shape.size();
    for (size_t d = 0; same_shape && d < t.shape.size(); ++d)
      same_shape =
          m.shape(static_cast<int>(d)) == static_cast<uint64_t>(t.shape[d]);
    if (t.layout || (!same_shape && m.global_shape_size() != 0)) {
      const TensorLayout want = Effective(t.layout, t.shape, t.name);
      const TensorLayout have = Effective(
          SavedLayout(m),
          std::vector<int64_t>(m.shape().begin(), m.shape().end()), m.name());
      if (!(want == have) || !same_shape)
        return absl::FailedPreconditionError(
            absl::StrCat(label, ": asked for ", want.ToString(),
                         ", the checkpoint holds ", have.ToString()));
    }
    if (m.dtype() != static_cast<uint32_t>(t.dtype))
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": dtype is ", AV(DTypeName(t.dtype)), ", the checkpoint has ",
          AV(DTypeName(static_cast<DType>(m.dtype())))));
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

struct FileRestorer::File {
  std::string path;
  int buffered = -1;
  int direct = -1;  // -1: the file system refuses O_DIRECT (tmpfs)
  ~File() {
    if (direct >= 0) ::close(direct);
    if (buffered >= 0) ::close(buffered);
  }
  // Opens path; an error names it (PermissionDenied, NotFound, ...), and
  // DataLoss if it is not a regular file of exactly `bytes` bytes.
  absl::Status Open(uint64_t bytes) {
    buffered = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (buffered < 0)
      return ErrnoToStatus(errno, absl::StrCat("open shard file ", path));
    struct stat st {};
    if (::fstat(buffered, &st) != 0)
      return ErrnoToStatus(errno, absl::StrCat("fstat shard file ", path));
    if (!S_ISREG(st.st_mode))
      return absl::DataLossError(
          absl::StrCat("shard file ", path, ": not a regular file"));
    if (static_cast<uint64_t>(st.st_size) != bytes)
      return absl::DataLossError(absl::StrCat(
          "shard file ", path, ": ", st.st_size, " bytes, expected ", bytes));
    direct = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    return absl::OkStatus();
  }
};

struct FileRestorer::Progress {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> read;  // per chunk: all its bytes are in memory
  size_t copied = 0;       // chunks [0, copied) were taken by the caller
  bool abort = false;
  absl::Status read_status;
};

FileRestorer::FileRestorer(CopyEngine* engine, DeviceCopier* devices)
    : engine_(engine), devices_(devices) {}

FileRestorer::~FileRestorer() {
  for (Bounce* b : {&whole_, &spans_}) {
    if (b->memory == nullptr) continue;
    if (b->pinned) {
      absl::Status s = devices_->UnregisterHost(b->memory);
      // A destructor cannot report, and the mapping goes next regardless.
      (void)s;
    }
    ::munmap(b->memory, kBounceBuffers * b->each);
  }
}

absl::Status FileRestorer::EnsureBuffersLocked() {
  Bounce& b = *bounce_;
  if (b.memory != nullptr) return absl::OkStatus();
  const uint64_t bytes = kBounceBuffers * b.each;
  // Page-aligned. Restore's are pre-faulted, so neither O_DIRECT nor the
  // first restore pays for page faults; ReadSpans' are not: it uses the
  // first chunk of each buffer, mostly, and a populated mapping would cost
  // every restore of a new client 12 MiB of page clearing.
  void* p = ::mmap(
      nullptr, bytes, PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | (bounce_ == &whole_ ? MAP_POPULATE : 0), -1,
      0);
  if (p == MAP_FAILED)
    return ErrnoToStatus(
        errno, absl::StrCat("restore: map ", bytes, " bytes of read buffers"));
  b.memory = static_cast<char*>(p);
  if (devices_->HasDevice()) {
    CKPT_RETURN_IF_ERROR(Annotate(devices_->RegisterHost(b.memory, bytes),
                                  "restore: pin the read buffers"));
    b.pinned = true;
  }
  return absl::OkStatus();
}

void FileRestorer::PlanLocked(uint64_t image_bytes,
                              std::span<const Tensor> tensors,
                              std::span<const v1::TensorMeta* const> metas,
                              std::vector<size_t>* first_hash) {
  // Pieces in file order, grouped into chunks of whole pieces.
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return metas[a]->offset() < metas[b]->offset();
  });
  first_hash->assign(tensors.size(), 0);
  size_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    (*first_hash)[i] = total;
    total += ChecksumChunks(metas[i]->bytes());
  }
  hashes_.assign(total, 0);
  pieces_.clear();
  for (size_t i : order) {
    const uint64_t n = metas[i]->bytes();
    const Tensor& t = tensors[i];
    for (uint64_t off = 0, k = 0; off < n; off += kChecksumChunk, ++k) {
      Piece pc;
      pc.offset = metas[i]->offset() + off;
      pc.bytes = std::min<uint64_t>(kChecksumChunk, n - off);
      if (t.device.is_host()) {
        pc.dst = static_cast<char*>(t.data) + off;
      } else {
        pc.tensor = i;
        pc.dst_offset = off;
      }
      pc.hash_index = (*first_hash)[i] + k;
      pieces_.push_back(pc);
    }
  }
  GroupLocked(image_bytes);
}

void FileRestorer::GroupLocked(uint64_t image_bytes) {
  chunks_.clear();
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const Piece& pc = pieces_[p];
    // Host memory at a 4 KiB-aligned address takes O_DIRECT reads of its
    // own bytes: no bounce buffer, no copy, only the hash pass.
    char* direct =
        pc.dst != nullptr && reinterpret_cast<uintptr_t>(pc.dst) % kAlign == 0
            ? pc.dst
            : nullptr;
    if (!chunks_.empty()) {
      Chunk& c = chunks_.back();
      const uint64_t c_end = c.offset + c.len;
      if (direct != nullptr) {
        if (c.direct != nullptr && direct == c.direct + c.len &&
            pc.offset == c_end && c.len + pc.bytes <= kBounceBytes) {
          c.len += pc.bytes;
          c.end_piece = p + 1;
          continue;
        }
      } else {
        const uint64_t end =
            std::min(AlignUp(pc.offset + pc.bytes), image_bytes);
        if (c.direct == nullptr && pc.offset <= c_end + kMaxGap &&
            std::max(end, c_end) - c.offset <= bounce_->each) {
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
  for (Chunk& c : chunks_) c.left = c.len;
}

char* FileRestorer::ChunkMemory(size_t c) const {
  return chunks_[c].direct != nullptr
             ? chunks_[c].direct
             : bounce_->memory + (c % kBounceBuffers) * bounce_->each;
}

void FileRestorer::ReadLoop(const File& f, storage::IoQueue* q, Progress* p) {
  // A bounce chunk c may start once chunk c - kBounceBuffers, the last user
  // of its buffer, was taken; a direct chunk at once (its memory is the
  // tensor's own).
  auto startable = [&](size_t c) {
    return chunks_[c].direct != nullptr || c < p->copied + kBounceBuffers;
  };
  const storage::IoQueue::Done done = [&](uint64_t tag, uint64_t len) {
    Chunk& c = chunks_[tag];
    c.left -= len;
    if (c.left > 0) return;
    std::lock_guard<std::mutex> l(p->mu);
    p->read[tag] = 1;
    p->cv.notify_all();
  };
  size_t next = 0;
  for (;;) {
    while (next < chunks_.size() && q->WantsMore()) {
      std::unique_lock<std::mutex> l(p->mu);
      if (p->abort) return;
      if (!startable(next)) {
        if (q->outstanding() > 0) break;  // reap; the caller catches up
        p->cv.wait(l, [&] { return p->abort || startable(next); });
        if (p->abort) return;
      }
      l.unlock();
      const Chunk& c = chunks_[next];
      q->Queue(f.direct, f.buffered, ChunkMemory(next), c.offset, c.len,
               c.direct != nullptr ? c.len : bounce_->each, next);
      ++next;
    }
    if (q->outstanding() == 0) {
      if (next == chunks_.size()) return;
      continue;
    }
    absl::Status s = q->Reap(done);
    if (!s.ok()) {
      std::lock_guard<std::mutex> l(p->mu);
      p->read_status = std::move(s);
      p->abort = true;
      p->cv.notify_all();
      return;
    }
  }
}

absl::Status FileRestorer::Restore(
    const std::string& path, uint64_t image_bytes,
    std::span<const Tensor> tensors,
    std::span<const v1::TensorMeta* const> metas) {
  std::lock_guard<std::mutex> lock(mu_);
  bounce_ = &whole_;
  std::vector<size_t> first_hash;
  PlanLocked(image_bytes, tensors, metas, &first_hash);
  CKPT_RETURN_IF_ERROR(ReadLocked(path, image_bytes, tensors, nullptr));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t sum =
        CombineChunkHashes(std::span<const uint64_t>(hashes_).subspan(
            first_hash[i], ChecksumChunks(metas[i]->bytes())));
    if (metas[i]->has_checksum() && metas[i]->checksum() != sum)
      return absl::DataLossError(absl::StrFormat(
          "%s: checksum mismatch (stored %016x, computed %016x) in %s",
          TensorLabel(tensors, i), metas[i]->checksum(), sum, path));
  }
  return absl::OkStatus();
}

absl::Status FileRestorer::ReadSpans(const std::string& path,
                                     uint64_t image_bytes,
                                     std::span<const Span> spans,
                                     std::span<uint64_t> hashes,
                                     const Landed& landed) {
  if (hashes.size() != spans.size())
    return absl::InternalError("ReadSpans: one hash per span");
  std::lock_guard<std::mutex> lock(mu_);
  bounce_ = &spans_;
  pieces_.clear();
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& sp = spans[i];
    if (sp.bytes == 0 || sp.bytes > kChecksumChunk || sp.offset > image_bytes ||
        image_bytes - sp.offset < sp.bytes)
      return absl::InvalidArgumentError(absl::StrCat(
          "shard file ", path, ": span ", i, " (", sp.bytes, " bytes at ",
          sp.offset, ") is not inside its ", image_bytes, " bytes"));
    Piece pc;
    pc.offset = sp.offset;
    pc.bytes = sp.bytes;
    pc.dst = sp.dst;
    pc.hash_index = i;
    pieces_.push_back(pc);
  }
  std::sort(pieces_.begin(), pieces_.end(),
            [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  for (size_t p = 1; p < pieces_.size(); ++p)
    if (pieces_[p].offset < pieces_[p - 1].offset + pieces_[p - 1].bytes)
      return absl::InvalidArgumentError(
          absl::StrCat("shard file ", path, ": spans overlap at offset ",
                       pieces_[p].offset));
  hashes_.assign(spans.size(), 0);
  GroupLocked(image_bytes);
  CKPT_RETURN_IF_ERROR(ReadLocked(path, image_bytes, {}, &landed));
  std::copy(hashes_.begin(), hashes_.end(), hashes.begin());
  return absl::OkStatus();
}

absl::Status FileRestorer::ReadLocked(const std::string& path,
                                      uint64_t image_bytes,
                                      std::span<const Tensor> tensors,
                                      const Landed* landed) {
  if (path.empty() || path[0] != '/' || path.back() == '/')
    return absl::InternalError(absl::StrCat("OpenRestore: path \"",
                                            path.substr(0, 256),
                                            "\" is not an absolute file path"));
  File file{path};
  CKPT_RETURN_IF_ERROR(file.Open(image_bytes));
  // Without io_uring (a kernel or seccomp filter that refuses it) the
  // queue runs pread.
  auto queue = std::make_unique<storage::IoQueue>(
      &rings_, storage::IoOp::kRead, kReadDepth, kReadIoBytes,
      absl::StrCat("shard file ", path));
  for (const Chunk& c : chunks_) {
    if (c.direct != nullptr) continue;
    CKPT_RETURN_IF_ERROR(EnsureBuffersLocked());
    break;
  }

  Progress progress;
  progress.read.assign(chunks_.size(), 0);
  std::unique_ptr<DeviceCopyBatch> dma = devices_->NewBatch();
  std::thread reader([&] { ReadLoop(file, queue.get(), &progress); });
  absl::Status s;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    {
      std::unique_lock<std::mutex> l(progress.mu);
      progress.cv.wait(l, [&] { return progress.abort || progress.read[c]; });
      if (progress.abort) break;
    }
    s = CopyChunk(chunks_[c], ChunkMemory(c), tensors, dma.get(), landed);
    std::lock_guard<std::mutex> l(progress.mu);
    if (!s.ok()) progress.abort = true;
    progress.copied = c + 1;
    progress.cv.notify_all();
    if (!s.ok()) break;
  }
  reader.join();
  queue.reset();  // nothing in flight writes into tensors or buffers now
  if (!progress.read_status.ok())
    return absl::DataLossError(progress.read_status.message());
  return s;
}

absl::Status FileRestorer::CopyChunk(const Chunk& c, const char* buf,
                                     std::span<const Tensor> tensors,
                                     DeviceCopyBatch* dma,
                                     const Landed* landed) {
  regions_.clear();
  for (size_t p = c.first_piece; p < c.end_piece; ++p) {
    const Piece& pc = pieces_[p];
    // Device pieces, and direct reads (already in place): hash only.
    char* dst = c.direct == nullptr ? pc.dst : nullptr;
    regions_.push_back({buf + (pc.offset - c.offset), dst, pc.bytes});
  }
  // Device pieces go by DMA while the engine hashes their bounce bytes; the
  // buffer is reused only after Wait().
  absl::Status s;
  bool any_device = false;
  for (size_t p = c.first_piece; p < c.end_piece && s.ok(); ++p) {
    const Piece& pc = pieces_[p];
    if (pc.tensor == kNoTensor) continue;
    const Tensor& t = tensors[pc.tensor];
    any_device = true;
    s = dma->EnqueueToDevice(t.device.index,
                             static_cast<char*>(t.data) + pc.dst_offset,
                             regions_[p - c.first_piece].src, pc.bytes);
    if (!s.ok()) s = Annotate(s, TensorLabel(tensors, pc.tensor));
  }
  region_hashes_.resize(regions_.size());
  if (s.ok()) engine_->RunPieces(regions_, region_hashes_);
  if (landed != nullptr && *landed) {
    // The caller's copies out of this memory (device ones wait below).
    any_device = true;
    for (size_t p = c.first_piece; p < c.end_piece && s.ok(); ++p)
      s = (*landed)(pieces_[p].hash_index, buf + (pieces_[p].offset - c.offset),
                    dma);
  }
  if (any_device) {
    // Wait even after an enqueue error: no DMA may read a reused buffer.
    absl::Status w = dma->Wait();
    if (s.ok() && !w.ok()) s = Annotate(w, "restore: device copies");
  }
  CKPT_RETURN_IF_ERROR(s);
  for (size_t p = c.first_piece; p < c.end_piece; ++p)
    hashes_[pieces_[p].hash_index] = region_hashes_[p - c.first_piece];
  return absl::OkStatus();
}

}  // namespace ckpt::client
