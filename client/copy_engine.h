// CopyEngine: parallel copy of host byte regions with per-region checksums,
// the hot loop of Save and Restore.
//
// Each region is cut into kChecksumChunk (1 MiB) pieces; a fixed pool of
// threads (created once, with the engine) and the calling thread take pieces
// from a shared counter, copy each with CopyAndHash while its bytes are in
// cache, and the region's checksum is CombineChunkHashes of its pieces in
// order, i.e. exactly TensorChecksum of the region's bytes. A region with a
// null dst is only hashed. Run() allocates nothing proportional to the data:
// its piece tables keep their capacity between calls.
//
// Thread-safety: Run() may be called from several threads; calls are
// serialised. The engine must outlive every Run().
#ifndef CKPT_CLIENT_COPY_ENGINE_H_
#define CKPT_CLIENT_COPY_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace ckpt::client {

struct CopyRegion {
  const void* src = nullptr;
  void* dst = nullptr;  // nullptr: hash src only
  uint64_t bytes = 0;
};

class CopyEngine {
 public:
  // threads: participants in a Run, the caller included; 0 = online CPUs.
  explicit CopyEngine(int threads);
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Copies (or hashes) every region; checksums[i] receives the checksum of
  // regions[i]. checksums.size() must equal regions.size().
  // chunk_hashes (may be null) receives every region's chunk hashes, region
  // after region (ChecksumChunks(bytes) each), whose combination is its
  // checksum.
  void Run(std::span<const CopyRegion> regions, std::span<uint64_t> checksums,
           std::vector<uint64_t>* chunk_hashes = nullptr);
  // Copies (or hashes) pieces of at most kChecksumChunk bytes each;
  // hashes[i] receives Hash64 of pieces[i]'s bytes (a raw chunk hash, to be
  // combined by the caller). hashes.size() must equal pieces.size().
  void RunPieces(std::span<const CopyRegion> pieces,
                 std::span<uint64_t> hashes);

 private:
  struct Piece {
    const char* src;
    char* dst;
    uint64_t bytes;
  };
  void WorkerLoop();
  void Drain();
  // Runs pieces_ on the pool and the caller; fills piece_hashes_.
  void RunLocked();

  std::mutex run_mu_;  // serialises Run()
  std::vector<Piece> pieces_;
  std::vector<uint64_t> piece_hashes_;
  std::atomic<size_t> next_piece_{0};

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;
  int active_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_COPY_ENGINE_H_
