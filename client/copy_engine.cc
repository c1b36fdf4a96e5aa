#include "client/copy_engine.h"

#include <unistd.h>

#include <algorithm>

#include "util/checksum.h"

namespace ckpt::client {

CopyEngine::CopyEngine(int threads) {
  if (threads <= 0)
    threads = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i)
    workers_.emplace_back([this] { WorkerLoop(); });
}

CopyEngine::~CopyEngine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void CopyEngine::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      work_cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    Drain();
    std::lock_guard<std::mutex> l(mu_);
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void CopyEngine::Drain() {
  const size_t n = pieces_.size();
  for (size_t i = next_piece_.fetch_add(1, std::memory_order_relaxed); i < n;
       i = next_piece_.fetch_add(1, std::memory_order_relaxed)) {
    const Piece& p = pieces_[i];
    piece_hashes_[i] = p.dst != nullptr ? CopyAndHash(p.dst, p.src, p.bytes)
                                        : Hash64(p.src, p.bytes);
  }
}

void CopyEngine::RunLocked() {
  piece_hashes_.resize(pieces_.size());
  next_piece_.store(0, std::memory_order_relaxed);
  // Waking the pool costs more than one piece takes.
  if (pieces_.size() > 1 && !workers_.empty()) {
    {
      std::lock_guard<std::mutex> l(mu_);
      active_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    work_cv_.notify_all();
    Drain();
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return active_ == 0; });
  } else {
    Drain();
  }
}

void CopyEngine::RunPieces(std::span<const CopyRegion> pieces,
                           std::span<uint64_t> hashes) {
  std::lock_guard<std::mutex> run_lock(run_mu_);
  pieces_.clear();
  for (const CopyRegion& r : pieces)
    pieces_.push_back(
        {static_cast<const char*>(r.src), static_cast<char*>(r.dst), r.bytes});
  RunLocked();
  std::copy(piece_hashes_.begin(), piece_hashes_.end(), hashes.begin());
}

void CopyEngine::Run(std::span<const CopyRegion> regions,
                     std::span<uint64_t> checksums,
                     std::vector<uint64_t>* chunk_hashes) {
  std::lock_guard<std::mutex> run_lock(run_mu_);
  pieces_.clear();
  for (const CopyRegion& r : regions) {
    const auto* src = static_cast<const char*>(r.src);
    auto* dst = static_cast<char*>(r.dst);
    for (uint64_t off = 0; off < r.bytes; off += kChecksumChunk)
      pieces_.push_back({src + off, dst == nullptr ? nullptr : dst + off,
                         std::min<uint64_t>(kChecksumChunk, r.bytes - off)});
  }
  RunLocked();
  if (chunk_hashes != nullptr)
    chunk_hashes->assign(piece_hashes_.begin(), piece_hashes_.end());
  size_t first = 0;
  for (size_t i = 0; i < regions.size(); ++i) {
    size_t count = ChecksumChunks(regions[i].bytes);
    checksums[i] = CombineChunkHashes(
        std::span<const uint64_t>(piece_hashes_).subspan(first, count));
    first += count;
  }
}

}  // namespace ckpt::client
