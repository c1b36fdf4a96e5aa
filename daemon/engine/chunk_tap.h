// ChunkTap: the 1 MiB checksum chunks (util/checksum.h) of a shard image's
// tensors, hashed as an object store's bytes come in
// (storage::ObjectReader::Received), while they are still in cache, so
// that a load's per-tensor check needs no second pass over the slot. A
// chunk is hashed so only when one transfer of one piece showed all of its
// bytes in order; the others (a chunk cut by a piece's end, a piece that
// started over and broke off, a reader that shows nothing) are hashed from
// the slot by Checksum.
//
// Thread-safety: Seen may be called from several threads at once, each
// piece from one thread at a time. Checksum(i) reads what the pieces
// holding tensor i set: the caller orders those pieces' Seen calls before
// it (ReadVerified: the Arrived counters). SeenWhole after the read.
#ifndef CKPT_DAEMON_ENGINE_CHUNK_TAP_H_
#define CKPT_DAEMON_ENGINE_CHUNK_TAP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "storage/shard_format.h"
#include "util/hash_stream.h"

namespace ckpt::daemon {

class ChunkTap {
 public:
  explicit ChunkTap(const storage::ShardInfo& info);

  // storage::ObjectReader::Received: [at, at + n) of the image, of the
  // piece that starts at `piece`; at == piece starts the piece (again).
  void Seen(uint64_t piece, uint64_t at, const char* data, size_t n);

  // How many chunks were hashed as they came in, of how many.
  std::pair<size_t, size_t> SeenWhole() const;

  // Tensor i's checksum (util/checksum.h TensorChecksum), its chunks that
  // were not seen whole hashed from the image at dst.
  uint64_t Checksum(size_t i, const char* dst) const;

 private:
  struct Chunk {
    uint64_t start = 0, len = 0;
  };
  struct Piece {
    Hash64Stream hash;
    uint64_t next = 0;  // where the next bytes must start
    size_t pos = 0;     // in order_: the first chunk not passed yet
    bool open = false;  // hash holds the chunk at pos from its start
    bool broken = false;
  };
  uint64_t End(size_t c) const { return chunks_[c].start + chunks_[c].len; }
  // The piece starts (again): what an earlier transfer of it showed is void.
  void Restart(Piece* p, uint64_t piece);
  // Clears what a transfer of the piece at `piece` that reached `until` set:
  // the chunks within [piece, until) (no other piece's).
  void Forget(uint64_t piece, uint64_t until);

  std::vector<Chunk> chunks_;
  std::vector<size_t> first_;  // tensor i's chunks: [first_[i], first_[i+1])
  std::vector<size_t> order_;  // chunk indices by offset
  std::vector<uint64_t> hash_;
  std::vector<uint8_t> have_;  // a byte each: pieces set theirs concurrently
  std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Piece>> pieces_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_ENGINE_CHUNK_TAP_H_
