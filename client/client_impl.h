// Client::Impl: the state behind a ckpt::Client (see include/ckpt/client.h).
//
// Saves run on one saver thread owned by the Impl, in the order they were
// submitted: SaveAsync validates on the caller's thread, then waits at the
// copy gate until the previous save has been copied, and queues the job.
// The saver registers the arena on first use, asks the daemon for a slot,
// copies (host tensors on the CopyEngine, device tensors by DMA through the
// DeviceCopier), signals
// "copied", and commits. Restores run on the caller's thread. Arenas are
// held by shared_ptr so a restore and a save (or a re-registration that
// grows the arena) never unmap memory the other still reads. Restore makes
// one OpenRestore: the daemon answers with a leased slot, or (a step only on
// disk whose file this process can read) with the file, which the
// FileRestorer reads without an arena.
#ifndef CKPT_CLIENT_CLIENT_IMPL_H_
#define CKPT_CLIENT_CLIENT_IMPL_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ckpt/client.h"
#include "client/copy_engine.h"
#include "client/daemon_stub.h"
#include "client/device_copier.h"
#include "client/file_restore.h"
#include "client/progress_beacon.h"
#include "shm/arena.h"
#include "storage/layout.h"
#include "storage/reshard_plan.h"
#include "storage/shard_format.h"

namespace ckpt {

struct SaveHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool copied = false;
  bool done = false;
  absl::Status copy_status;
  absl::Status status;

  void SetCopied(absl::Status s);
  void SetDone(absl::Status s);
};

namespace client {

// Identity (device, inode) of the shm segment named `name`; false if it
// does not exist.
bool SegmentIdentity(const std::string& name, dev_t* dev, ino_t* ino);

// An attached arena, page-locked for DMA when a device exists.
struct MappedArena {
  ~MappedArena();  // unpins through `pinned_by`
  // False once the name refers to another segment (or none): the daemon
  // replaced the arena and this mapping is orphaned.
  bool IsCurrent() const;
  std::unique_ptr<shm::Arena> arena;
  dev_t dev = 0;  // identity of the segment, to tell a re-created one apart
  ino_t ino = 0;
  DeviceCopier* pinned_by = nullptr;  // set once the slots are page-locked
};

// Ends the error of a restore into another layout that failed after bytes
// moved: the tensors are not restored and hold a mix.
inline constexpr char kPartlyWritten[] =
    "(the requested tensors are partly written; none of them is restored)";

}  // namespace client

class Client::Impl {
 public:
  using Clock = std::chrono::steady_clock;

  Impl(ClientOptions options, std::unique_ptr<client::DaemonStub> stub);
  ~Impl();  // Finishes every queued save first.

  const ClientOptions& options() const { return options_; }
  // Registers at once when options.slot_bytes is set.
  [[nodiscard]] absl::Status Start();

  [[nodiscard]] absl::StatusOr<SaveHandle> SaveAsync(
      int64_t step, std::span<const Tensor> tensors,
      const SaveOptions& options);
  [[nodiscard]] absl::StatusOr<int64_t> LatestStep();
  [[nodiscard]] absl::StatusOr<int64_t> RestoreLatest(
      std::span<const Tensor> tensors);
  // layouts (may be null): the saved layout of each tensor. `saved_rank`:
  // the shard of that rank (Client::RestoreSavedRank), else this rank's
  // own.
  [[nodiscard]] absl::Status Restore(
      int64_t step, std::span<const Tensor> tensors,
      std::vector<std::optional<TensorLayout>>* layouts,
      std::optional<uint32_t> saved_rank = std::nullopt);
  [[nodiscard]] absl::Status WaitDurable(int64_t step,
                                         std::chrono::milliseconds timeout);
  SaveStats last_save_stats() const;
  RestoreStats last_restore_stats() const;
  client::ProgressBeacon& beacon() { return beacon_; }

 private:
  struct SaveJob {
    int64_t step = 0;
    SaveOptions options;
    std::vector<Tensor> tensors;
    std::vector<uint64_t> bytes;
    storage::ShardLayout layout;
    std::shared_ptr<SaveHandle::State> state;
    Clock::time_point start;
  };

  void SaverLoop();
  void RunSave(SaveJob& job);
  // Copies the job's tensors into the slot at `slot`; fills checksums (host
  // tensors only).
  // and each host tensor's chunk hashes (from (*chunk_first)[i] on).
  [[nodiscard]] absl::Status CopyIntoSlot(SaveJob& job, char* slot,
                                          std::vector<uint64_t>* checksums,
                                          std::vector<uint64_t>* chunk_hashes,
                                          std::vector<size_t>* chunk_first);
  void ReleaseCopyGate();

  // The registered arena, (re-)registering when it is missing or its slots
  // are smaller than image_bytes.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<client::MappedArena>> SaveArena(
      uint64_t image_bytes);
  // An attached arena for (name, bytes): reuses a live mapping of the same
  // segment, else attaches (and pins).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<client::MappedArena>>
  ArenaLocked(const std::string& name, uint64_t arena_bytes,
              uint64_t slots_offset);
  // The image the daemon put in a slot for an OpenRestore: the arena
  // mapped (kept by `arena`), the answer's offset and size checked
  // against it.
  struct SlotImage {
    std::shared_ptr<client::MappedArena> arena;
    const char* image = nullptr;
  };
  [[nodiscard]] absl::StatusOr<SlotImage> MapSlotImage(
      const v1::OpenRestoreResponse& resp);
  // The host tensors a streamed OpenRestore copied while the daemon was
  // still loading the slot (OpenRestoreCopying), each hashed as it was
  // copied. CopyOutOfSlot copies the rest.
  struct EarlyCopy {
    bool active = false;  // the opened slot mapped, the index matched
    SlotImage slot;
    v1::OpenRestoreResponse opened;            // metas point into it
    std::vector<const v1::TensorMeta*> metas;  // per caller tensor
    std::vector<std::vector<size_t>> callers;  // per opened tensor
    std::vector<char> copied;                  // per caller tensor
    std::vector<uint64_t> sums;                // per caller tensor
    absl::Status status;  // a tensor that failed its checksum (DataLoss)
  };
  // One OpenRestore and the copy it names; a copy failing verification is
  // reported bad (DataLoss returned). *opened: the daemon offered a copy.
  // *own_metas (may be null) receives the shard's index when the copy
  // does not serve the request as asked (Reshardable).
  [[nodiscard]] absl::Status RestoreOneCopy(
      int64_t step, std::span<const Tensor> tensors,
      std::optional<uint32_t> saved_rank, bool* opened,
      std::vector<std::optional<TensorLayout>>* layouts,
      std::vector<v1::TensorMeta>* own_metas = nullptr);
  // Whether a restore's failure says "not what this rank saved" (a name
  // not in its shard, a tensor at another place, or, before any copy was
  // opened, a rank or step the daemon does not have for this rank), so
  // that a restore into another layout may serve it.
  static bool Reshardable(const absl::Status& s, bool opened);
  // Restores from the arena slot the daemon leased; closes the lease (and
  // reports the copy bad when it fails verification).
  // `lease_rank`: the rank the lease names (a saved rank's, or this one's).
  [[nodiscard]] absl::Status RestoreFromSlot(
      const v1::OpenRestoreResponse& resp, std::span<const Tensor> tensors,
      uint32_t lease_rank, const EarlyCopy* early = nullptr);
  // Closes the lease `lease` on `rank`'s shard of `step` after a restore
  // that ended with `s`: a DataLoss reports the copy bad. Returns `s`, or,
  // when it is OK and a lease was held, the close's own status.
  [[nodiscard]] absl::Status CloseLease(uint32_t rank, uint64_t step,
                                        uint64_t lease, absl::Status s);
  // OpenRestore through OpenRestoreStream: the answer, and meanwhile the
  // host tensors whose bytes the daemon's load verified are copied into
  // `tensors` (*early). An older daemon: one OpenRestore, nothing early.
  [[nodiscard]] absl::StatusOr<v1::OpenRestoreResponse> OpenRestoreCopying(
      const v1::OpenRestoreRequest& open, std::span<const Tensor> tensors,
      EarlyCopy* early);
  void StartEarlyCopy(const v1::OpenRestoreResponse& opened,
                      std::span<const Tensor> tensors, EarlyCopy* early);
  void CopyVerified(std::span<const uint32_t> fresh,
                    std::span<const Tensor> tensors, EarlyCopy* early);
  // `early` (may be null): tensors already copied (and hashed) are not
  // copied again; its failure is the answer.
  [[nodiscard]] absl::Status CopyOutOfSlot(const v1::OpenRestoreResponse& resp,
                                           const char* image,
                                           std::span<const Tensor> tensors,
                                           const EarlyCopy* early = nullptr);

  // Restore into another layout (reshard_restore.cc): the step's layout
  // index from the daemon, the planner's reads, each saved rank opened in
  // turn and its byte runs copied into the tensors, every saved piece a
  // read touches verified. `own_metas`: this rank's saved index, when it
  // was read (a tensor asked by a piece name without a layout keeps that
  // piece's place).
  [[nodiscard]] absl::Status RestoreResharded(
      int64_t step, std::span<const Tensor> tensors,
      std::span<const v1::TensorMeta> own_metas,
      std::vector<std::optional<TensorLayout>>* layouts, RestoreStats* stats);
  // One saved rank's reads: opens it (OpenRestore saved_rank, a slot),
  // copies and verifies, closes (reporting a bad copy).
  // `ranges`: [begin, end) of the saved rank's image the reads touch,
  // sent with the open (a ranged fetch from a peer); `pre`: an answer of
  // an open made already (used instead of opening).
  [[nodiscard]] absl::Status RestoreSavedRankRuns(
      int64_t step, uint32_t saved_rank,
      std::span<const std::pair<uint64_t, uint64_t>> ranges,
      const storage::LayoutIndex& saved, const storage::LayoutIndex& requested,
      std::span<const storage::PlannedRead> reads,
      std::span<const Tensor> tensors, bool* opened,
      const v1::OpenRestoreResponse* pre, RestoreStats* stats);
  // OpenRestore of a saved rank, with the ranges its reads touch.
  v1::OpenRestoreRequest SavedRankOpen(
      int64_t step, uint32_t saved_rank,
      std::span<const std::pair<uint64_t, uint64_t>> ranges) const;
  // Where a saved rank's bytes are: its image in a slot, or (image null)
  // its shard file, whose touched chunks the FileRestorer reads.
  struct SavedSource {
    const char* image = nullptr;
    std::string path;
  };
  // Copies the reads' runs out of src and verifies every saved piece they
  // touch (DataLoss naming the tensor and the saved rank).
  [[nodiscard]] absl::Status CopyRuns(
      const v1::OpenRestoreResponse& resp, const SavedSource& src,
      uint32_t saved_rank, const storage::LayoutIndex& saved,
      const storage::LayoutIndex& requested,
      std::span<const storage::PlannedRead> reads,
      std::span<const Tensor> tensors, RestoreStats* stats);

  const ClientOptions options_;
  const std::unique_ptr<client::DaemonStub> stub_;
  client::CopyEngine engine_;
  // False once the daemon answered OpenRestoreStream with UNIMPLEMENTED.
  std::atomic<bool> stream_restores_{true};
  const std::unique_ptr<client::DeviceCopier> devices_;
  std::unique_ptr<client::FileRestorer> file_restorer_;  // source FILE

  client::ProgressBeacon beacon_;
  // Restores into another layout run one at a time.
  std::mutex reshard_mu_;

  std::mutex arena_mu_;
  std::shared_ptr<client::MappedArena> save_arena_;
  std::shared_ptr<client::MappedArena> restore_arena_;

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::condition_variable gate_cv_;
  std::deque<SaveJob> queue_;
  bool copy_gate_closed_ = false;  // a save is queued or copying
  bool stop_ = false;

  std::unique_ptr<client::DeviceCopyBatch> save_dma_;  // saver thread only

  mutable std::mutex stats_mu_;
  SaveStats stats_;
  RestoreStats restore_stats_;

  std::thread saver_;  // last: started once everything above exists
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_CLIENT_IMPL_H_
