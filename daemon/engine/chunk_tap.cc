// ChunkTap: see chunk_tap.h.
#include "daemon/engine/chunk_tap.h"

#include <algorithm>

#include "util/checksum.h"

namespace ckpt::daemon {

ChunkTap::ChunkTap(const storage::ShardInfo& info) {
  for (const storage::ShardTensor& t : info.tensors) {
    first_.push_back(chunks_.size());
    for (uint64_t k = 0; k < ChecksumChunks(t.bytes); ++k) {
      const uint64_t off = k * kChecksumChunk;
      chunks_.push_back(
          {t.offset + off, std::min<uint64_t>(kChecksumChunk, t.bytes - off)});
    }
  }
  first_.push_back(chunks_.size());
  order_.resize(chunks_.size());
  for (size_t c = 0; c < order_.size(); ++c) order_[c] = c;
  std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
    return chunks_[a].start < chunks_[b].start;
  });
  hash_.assign(chunks_.size(), 0);
  have_.assign(chunks_.size(), 0);
}

void ChunkTap::Seen(uint64_t piece, uint64_t at, const char* data, size_t n) {
  Piece* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Piece>& slot = pieces_[piece];
    if (!slot) slot = std::make_unique<Piece>();
    p = slot.get();
  }
  if (at == piece) Restart(p, piece);
  if (p->broken) return;
  if (at != p->next) {  // not the bytes that follow: trust none of it
    Forget(piece, p->next);
    p->broken = true;
    return;
  }
  p->next = at + n;
  while (n > 0) {
    while (p->pos < order_.size() && End(order_[p->pos]) <= at) {
      ++p->pos;
      p->open = false;
    }
    if (p->pos == order_.size()) return;
    const size_t c = order_[p->pos];
    const uint64_t start = chunks_[c].start;
    if (start >= at + n) return;  // bytes before the next chunk
    if (start > at) {             // skip to the chunk's start
      data += start - at;
      n -= start - at;
      at = start;
    }
    if (at == start) {
      p->hash.Reset();
      p->open = true;
    }
    const uint64_t take = std::min<uint64_t>(n, End(c) - at);
    if (p->open) p->hash.Update(data, take);  // else it began before piece
    data += take;
    n -= take;
    at += take;
    if (at == End(c)) {
      if (p->open) hash_[c] = p->hash.Digest(), have_[c] = 1;
      p->open = false;
      ++p->pos;
    }
  }
}

std::pair<size_t, size_t> ChunkTap::SeenWhole() const {
  size_t seen = 0;
  for (uint8_t h : have_) seen += h;
  return {seen, have_.size()};
}

uint64_t ChunkTap::Checksum(size_t i, const char* dst) const {
  std::vector<uint64_t> h;
  for (size_t c = first_[i]; c < first_[i + 1]; ++c)
    h.push_back(have_[c] != 0 ? hash_[c]
                              : Hash64(dst + chunks_[c].start, chunks_[c].len));
  return CombineChunkHashes(h);
}

void ChunkTap::Restart(Piece* p, uint64_t piece) {
  Forget(piece, p->next);
  p->next = piece;
  p->pos = 0;
  p->open = false;
  p->broken = false;
}

void ChunkTap::Forget(uint64_t piece, uint64_t until) {
  for (size_t c = 0; c < chunks_.size(); ++c)
    if (chunks_[c].start >= piece && End(c) <= until) have_[c] = 0;
}

}  // namespace ckpt::daemon
