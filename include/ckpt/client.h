// libckpt: the trainer's side of ckptd.
//
// A Client is one rank's connection to the node-local daemon. Save() copies
// the given tensors into a slot of the rank's shared-memory arena (owned by
// the daemon, so a trainer crash never loses a staged step), computes a
// checksum per tensor while the bytes are hot, and hands the slot to the
// daemon, which persists it in the background. Restore() reads the node's
// shared memory when the step is still there, else the shard on disk, and
// verifies every checksum.
//
// Thread-safety: a Client may be used from several threads, but saves are
// serialised: a second Save/SaveAsync waits until the copy of the first one
// is done. SaveHandle is not thread-safe; wait on it from one thread.
#ifndef CKPT_CLIENT_H_
#define CKPT_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt/tensor.h"

namespace ckpt {

struct ClientOptions {
  // Fields left empty / negative / unset are taken from the environment:
  // CKPT_SOCKET, CKPT_JOB, RANK, WORLD_SIZE (rank and world_size as
  // ResolveRank decides them), CKPT_GENERATION.
  std::string socket_path;
  std::string job;
  int rank = -1;
  int world_size = -1;
  // The job generation the trainer runs in (ckptrun sets CKPT_GENERATION);
  // every save carries it so the coordinator can drop saves of an
  // abandoned timeline. Unset and no CKPT_GENERATION: saves carry none.
  std::optional<uint64_t> generation;

  // Bytes per slot; 0 sizes the slots to the first save (plus
  // slot_headroom) when the arena is created.
  uint64_t slot_bytes = 0;
  double slot_headroom = 0.0;
  // Slots per arena (at least 2).
  int num_slots = 2;
  // With no free slot: block until one frees (true) or return
  // ResourceExhausted ("BUSY") at once (false).
  bool block_when_busy = true;
  std::chrono::milliseconds busy_timeout{std::chrono::minutes(10)};
  // Threads for host copies; 0 = one per online CPU.
  int copy_threads = 0;

  // Fills unset fields from the environment and checks every field; the
  // error names the field (or variable) that is missing or wrong.
  [[nodiscard]] absl::Status ResolveFromEnvironment();
};

// The launcher rule, decided here for every front end (this client, the C
// API's ckpt_resolve_rank, the Python package). A *rank or *world_size of
// -1 is taken from $RANK / $WORLD_SIZE; with neither given nor set (a
// process no launcher started) it is rank 0 of 1. *local_rank (may be
// null) is $LOCAL_RANK, or -1 when unset. A non-integer, negative or
// out-of-range value is InvalidArgument naming the field or variable, and
// nothing is written.
[[nodiscard]] absl::Status ResolveRank(int* rank, int* world_size,
                                       int* local_rank);

// In-process restart under ckptrun (doc/operations.md, "In-process
// restart"): the launcher keeps a trainer that said it can restart in its
// process, and hands it each new generation's assignment instead of
// stopping it. Every call works on $CKPT_RESTART_DIR, the directory ckptrun
// gives each trainer process.
struct RestartPlan {
  uint64_t generation = 0;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t local_rank = 0;
  uint32_t local_world_size = 0;
  std::string master_addr;  // the rendezvous of this generation
  uint32_t master_port = 0;
  std::optional<int64_t> restore_step;  // unset: a fresh start
};

// Tells ckptrun this process restarts in place (it writes `capable`).
// FailedPrecondition when $CKPT_RESTART_DIR is unset (not under ckptrun).
[[nodiscard]] absl::Status EnableRestart();
// The newest plan, when its generation is greater than `after`; nullopt
// when it is not (or no plan was written yet). Never blocks: one small
// file read, cheap enough to poll every few milliseconds. A malformed plan
// is InvalidArgument naming the key.
[[nodiscard]] absl::StatusOr<std::optional<RestartPlan>> PollRestart(
    uint64_t after);
// Tells ckptrun this process left its old generation and takes plan
// `generation` (it writes `joined`).
[[nodiscard]] absl::Status JoinedRestart(uint64_t generation);

class Client;

// The progress of one SaveAsync. Copied: the caller may modify (or free)
// the tensors again. Done: the daemon holds the step (staged); it becomes
// durable later (see Client::WaitDurable).
class SaveHandle {
 public:
  SaveHandle();
  SaveHandle(SaveHandle&&) noexcept;
  SaveHandle& operator=(SaveHandle&&) noexcept;
  ~SaveHandle();  // Waits for completion; the status is then dropped.

  // Blocks until every tensor has been read; returns the copy's status.
  [[nodiscard]] absl::Status WaitCopied();
  // Blocks until the daemon has taken the step; returns the save's status.
  [[nodiscard]] absl::Status Wait();
  bool valid() const { return state_ != nullptr; }

  struct State;

 private:
  friend class Client;
  explicit SaveHandle(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

// How one save treats the rank's newer steps.
struct SaveOptions {
  // A save of a step below this rank's newest deletes the newer steps (a
  // new timeline). The daemon refuses that (FailedPrecondition naming the
  // newer steps) unless this process restored an older step of the job
  // first (a restarted trainer resuming: the normal recovery path) or
  // rewind is set here.
  bool rewind = false;
};

struct SaveStats {
  double wait_slot_s = 0;  // time blocked waiting for a free slot
  double copy_s = 0;       // copy + checksum
  double rpc_s = 0;        // BeginSave + Commit
  double total_s = 0;
  uint64_t bytes = 0;
};

// What the last finished restore of a client read (its last Restore or
// RestoreSavedRank call, successful or not).
struct RestoreStats {
  uint64_t bytes = 0;        // bytes of the tensors asked for
  uint64_t bytes_read = 0;   // saved bytes read (copied or hashed) for them
  uint32_t saved_ranks = 0;  // saved ranks' shards read from
  // Served by the restore into another layout: bytes_read is then the
  // touched 1 MiB checksum chunks of the saved pieces (doc/resharding.md),
  // else the tensors' bytes of each copy tried.
  bool resharded = false;
};

class Client {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Connect(
      ClientOptions options);
  ~Client();

  const ClientOptions& options() const;

  // Copies the tensors into shared memory and commits the step; returns once
  // the daemon holds it. A save of the rank's newest step replaces it. A
  // save of a lower step drops the newer ones and is refused
  // (FailedPrecondition, nothing changes) unless this process restored a
  // step <= it first or options.rewind is set (see SaveOptions).
  [[nodiscard]] absl::Status Save(int64_t step,
                                  std::span<const Tensor> tensors);
  [[nodiscard]] absl::Status Save(int64_t step, std::span<const Tensor> tensors,
                                  const SaveOptions& options);
  // Starts a save and returns at once. CONTRACT: the tensors' bytes must
  // stay valid and unmodified until handle.WaitCopied() returns (for CUDA
  // tensors: until then, no kernel may write them).
  [[nodiscard]] absl::StatusOr<SaveHandle> SaveAsync(
      int64_t step, std::span<const Tensor> tensors);
  [[nodiscard]] absl::StatusOr<SaveHandle> SaveAsync(
      int64_t step, std::span<const Tensor> tensors,
      const SaveOptions& options);

  // The newest step restorable on every rank of the job; NotFound if none.
  [[nodiscard]] absl::StatusOr<int64_t> LatestStep();
  // Fills the given tensors (matched by name; a subset is allowed) with the
  // step's values. A mismatch of dtype, shape or size, an unknown name, or a
  // checksum mismatch fails with an error naming the tensor. A tensor asked
  // for at another place than this rank saved it (another layout, the
  // whole of a tensor saved in pieces, a rank beyond the saved world size)
  // is filled from the saved pieces that hold it, each chunk read verified
  // (doc/resharding.md, "Restore into another layout"); a region no saved
  // piece holds is FailedPrecondition naming it, and nothing is written.
  // Such a restore that fails after bytes moved says the tensors are
  // partly written: do not use them.
  [[nodiscard]] absl::Status Restore(int64_t step,
                                     std::span<const Tensor> tensors);
  // Restore of a step saved at another world size than this run's
  // (elastic continuation: a launcher names the saved rank in
  // $CKPT_RESTORE_RANK): fills the tensors from the shard of `saved_rank`.
  // For data-parallel state only: every rank's shard holds the whole.
  [[nodiscard]] absl::Status RestoreSavedRank(int64_t step, uint32_t saved_rank,
                                              std::span<const Tensor> tensors);
  // The same, and (*layouts)[i] is the layout tensors[i] was saved with
  // (nullopt: saved whole), or, after a restore into another layout, the
  // place it was filled at (nullopt: whole, asked without a layout).
  [[nodiscard]] absl::Status Restore(
      int64_t step, std::span<const Tensor> tensors,
      std::vector<std::optional<TensorLayout>>* layouts);
  // Restores the newest step whose copies verify and returns it. A copy
  // that fails verification is reported (the daemon checks it and drops it
  // if it is bad), the next copy of the step is tried, then the previous
  // good step, all in this one call; the tensors end holding exactly one
  // step's bytes. NotFound when the job has no checkpoint; DataLoss naming
  // every step tried when none verifies.
  [[nodiscard]] absl::StatusOr<int64_t> RestoreLatest(
      std::span<const Tensor> tensors);
  // Blocks until the step's shard of this rank is durable on disk.
  [[nodiscard]] absl::Status WaitDurable(
      int64_t step,
      std::chrono::milliseconds timeout = std::chrono::minutes(10));

  SaveStats last_save_stats() const;
  RestoreStats last_restore_stats() const;

  // Progress beacon (hang and straggler detection): call once per training
  // step, after the rank's own work of the step. A store into shared
  // memory, no system call or RPC (tens of nanoseconds). `compute_s`: the
  // seconds this rank spent in its own compute this step (excluding waits
  // for other ranks), so that a straggler can be told from the ranks that
  // wait for it. Before the rank's arena exists (its first save or
  // restore) the value waits in the process. A save counts as progress
  // too. Call from one thread at a time.
  void Progress(int64_t step);
  void Progress(int64_t step, double compute_s);
  // The next `seconds` may show no progress (evaluation, a long save): the
  // hang deadline of the current step is extended once, and `reason` is
  // kept with a hang event. Same thread rules as Progress.
  void ExpectPause(double seconds, std::string_view reason);

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_H_
