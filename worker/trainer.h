// Trainer: the training loop of ckpt-worker. It owns the model (MlpModel),
// a host-budget device sized so that exactly (1 - offload_fraction) of the
// optimizer's chunks stay "on device", and the chunked AdamW over the fp32
// master weights. Each step computes with the bf16 working weights, hands the
// gradients to the optimizer and steps it; every ckpt_every steps it saves
// through libckpt asynchronously, so the copy of step s overlaps the forward
// and backward of step s + 1 and is waited for only before the optimizer
// writes the weights again. Not thread-safe: one thread drives a Trainer.
//
// Data parallel (world_size > 1): the step's global batch of `model.batch`
// sequences is cut into world_size contiguous slices, rank r trains on slice
// r, and the gradients (and the loss) are averaged over the ranks with a ring
// allreduce before every rank takes the same optimizer step, so the replicas
// stay bitwise identical; Restore and Run check that they are (step and
// params digest gathered from every rank). Every rank saves its own full
// state as its shard.
//
// ZeRO-1 (options.zero1): the optimizer state (fp32 master weights, Adam
// moments) is partitioned over the ranks: rank r owns the contiguous slice
// [N r / W, N (r + 1) / W) of the N flattened parameters (tensors in
// order), cut into one piece per tensor it touches; its ChunkedAdam holds
// those pieces only. A step allreduces the gradients as above (each rank
// then uses its slice), runs AdamW on its slice, and all-gathers the
// updated bf16 working weights so every rank computes with the same ones.
// Elementwise AdamW on the same reduced gradients gives the same bits as
// plain data parallel. Each rank saves its slice as pieces with layouts
// (train_checkpoint.h); a restore at another world size reshards.
#ifndef CKPT_WORKER_TRAINER_H_
#define CKPT_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/client.h"
#include "worker/chunked_adam.h"
#include "worker/data_parallel.h"
#include "worker/host_device.h"
#include "worker/mlp_model.h"
#include "worker/train_checkpoint.h"

namespace ckpt::worker {

struct TrainerOptions {
  MlpConfig model;
  int64_t steps = 100;  // train until the optimizer has taken this many steps
  uint64_t seed = 1;    // initial weights and data
  int ckpt_every = 0;   // 0: never save
  double offload_fraction = 0.5;
  float lr = 3e-3f;
  int log_every = 10;  // 0: no per-step lines
  // Each step line also says "rank=R mono_ms=T" (T: CLOCK_MONOTONIC when
  // the step finished, the clock of the coordinator's events), so that a
  // benchmark times a recovery from the trainers' own lines.
  bool log_mono = false;
  int cpu_threads = 1;
  int rank = 0;
  int world_size = 1;  // model.batch is the global batch: a multiple of it
  // Fault injection (--fault-hang STEP:RANK): rank fault_hang_rank blocks
  // forever inside step fault_hang_step, before its compute, while the
  // other ranks wait for it in the allreduce; a process that restored a
  // checkpoint never does, so a job restarted after the hang finishes.
  // -1: never.
  int64_t fault_hang_step = -1;
  int fault_hang_rank = -1;
  // Fault injection (--fault-slow RANK:FACTOR): rank fault_slow_rank takes
  // fault_slow_factor times as long for its compute of every step (it
  // sleeps the difference after computing) and reports that time as its
  // compute_s, as a slow GPU or a throttled node would. -1: nobody.
  int fault_slow_rank = -1;
  double fault_slow_factor = 1.0;  // in [1, 100]
  // The first step this process runs sleeps this long before its compute
  // (a stand-in for warm-up: compilation, caches, lazy init). 0: none.
  double slow_first_step_s = 0;
  // Every eval_every steps (0: never), after the step, an evaluation:
  // forward passes over held-out batches for eval_s seconds (at least one
  // batch), declared beforehand with ExpectPause(eval_s, "evaluation ...").
  // The training state is not touched: a run with evaluations ends with
  // the same weights as one without.
  int eval_every = 0;
  double eval_s = 1.0;  // in (0, 3600]
  // ZeRO-1: each rank holds and saves only its slice of the optimizer
  // state (see above). Needs at least world_size parameters.
  bool zero1 = false;
};

// InvalidArgument naming the field (steps, ckpt_every, offload_fraction, lr,
// log_every, cpu_threads, rank, world_size, fault_slow_factor,
// slow_first_step_s, eval_every, eval_s, or a model size).
[[nodiscard]] absl::Status ValidateTrainerOptions(
    const TrainerOptions& options);

class Trainer {
 public:
  // client may be null: then the trainer never saves or restores. comm is
  // required when options.world_size > 1 and must match rank and world size.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      const TrainerOptions& options, std::unique_ptr<Client> client,
      std::unique_ptr<DataParallel> comm = nullptr);
  ~Trainer();

  // With a client: restores `step` when given, else the latest step of the
  // job if there is one (NotFound from the daemon means a fresh start).
  // Call before Run. Returns the step training continues from.
  // `from`: `step` was saved at another world size (a resized job): this
  // rank restores that saved rank's shard; the batch is re-partitioned
  // over this run's world size by construction (a contiguous slice each).
  // ZeRO-1: only from->world_size is used; this rank's new slice is
  // resharded from every saved rank's pieces.
  [[nodiscard]] absl::StatusOr<int64_t> Restore(
      std::optional<int64_t> step,
      std::optional<SavedRank> from = std::nullopt);

  // Trains up to options.steps; log lines go to `log` when not null.
  // Waits for the last save to be taken by the daemon before returning.
  absl::Status Run(std::FILE* log) { return RunUntil(options_.steps, log); }
  // Run, stopping at `last_step` (at most options.steps); callable again to
  // go on (the benchmark times a stretch of steps this way).
  [[nodiscard]] absl::Status RunUntil(int64_t last_step, std::FILE* log);

  // In-process restart. The trainer checks `stop` (null: never) before
  // each step and returns Aborted when it is set; it must outlive the
  // trainer's runs.
  void SetStopFlag(const std::atomic<bool>* stop) { stop_ = stop; }
  // Leaves the generation: waits for a save still in flight (it reads the
  // weights a restore would overwrite; the local daemon takes it without
  // any peer), then drops the connection to the peers (the gloo pairs;
  // rank 0's store server) and the client. Returns the step of the save
  // that was in flight, if one was.
  std::optional<int64_t> LeaveGeneration();
  // Joins the next generation with the same rank and world size: takes
  // its client and connection and restores `step` in place (Restore).
  [[nodiscard]] absl::StatusOr<int64_t> JoinGeneration(
      std::unique_ptr<Client> client, std::unique_ptr<DataParallel> comm,
      int64_t step);

  int64_t step() const { return step_; }
  // Loss of every step run by this process, in order.
  const std::vector<float>& losses() const { return losses_; }
  // XXH3-64 (util Hash64) of every fp32 master weight, tensors in order.
  // ZeRO-1: the ranks' slices are gathered first (a collective: every
  // rank calls it at the same point); the digest equals plain data
  // parallel's for the same weights.
  [[nodiscard]] absl::StatusOr<uint64_t> ParamsDigest() const;
  // ZeRO-1: "zero1 rank R of W owns elements [lo, hi) of N in P pieces,
  // C chunks"; plain data parallel: "".
  std::string PartitionSummary() const;

 private:
  [[noreturn]] void HangForever(int64_t step);
  // --fault-slow: sleeps (factor - 1) x `compute` on the slowed rank;
  // returns the compute time the rank reports (its own, slowed).
  double SlowDown(double compute_s) const;
  // The evaluation after step `step` (eval_every); logs its loss to `log`.
  [[nodiscard]] absl::Status Evaluate(int64_t step, std::FILE* log);
  Trainer(const TrainerOptions& options, std::unique_ptr<Client> client,
          std::unique_ptr<DataParallel> comm, MlpModel model);
  [[nodiscard]] absl::Status Initialize();
  absl::StatusOr<int64_t> RestoreThisRank(
      std::optional<int64_t> step,
      std::optional<SavedRank> from = std::nullopt);
  // Averages the gradients (and `loss`) over the ranks and hands them to the
  // optimizer.
  [[nodiscard]] absl::Status ReduceGradients(float& loss);
  // FailedPrecondition naming the ranks when their step or weights differ.
  [[nodiscard]] absl::Status CheckRanksAgree(const char* when);
  absl::Status LoadWorkingWeights();
  // ZeRO-1: gathers every rank's updated bf16 working weights into
  // working_bf16_ (once per optimizer step or restore).
  [[nodiscard]] absl::Status GatherWorkingWeights();
  [[nodiscard]] absl::Status FinishSave(bool wait_daemon);

  const TrainerOptions options_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<DataParallel> comm_;
  MlpModel model_;
  std::unique_ptr<HostBudgetDevice> device_;
  std::unique_ptr<ChunkedAdam> optimizer_;
  std::unique_ptr<TrainCheckpoint> checkpoint_;
  std::optional<SaveHandle> pending_save_;
  int64_t pending_save_step_ = 0;
  const std::atomic<bool>* stop_ = nullptr;
  std::vector<uint16_t> bf16_scratch_;
  std::vector<float> reduce_buffer_;  // every gradient, then the loss
  // What the optimizer holds: tensor j is pieces_[j] (plain data
  // parallel: every whole tensor, so j is the model's tensor index).
  std::vector<StatePiece> pieces_;
  std::vector<size_t> tensor_start_;  // flattened offset of model tensor i
  // ZeRO-1: every rank's slice, its element counts, and the gathered
  // bf16 working weights (flattened); valid for the optimizer step
  // working_step_ unless invalidated by a restore.
  std::vector<size_t> bounds_;
  std::vector<size_t> counts_;
  std::vector<uint16_t> working_bf16_;
  std::vector<uint16_t> mine_bf16_;
  int64_t working_step_ = -1;
  uint64_t data_seed_;
  int64_t step_ = 0;
  bool first_step_done_ = false;
  bool restored_ = false;  // this process restored a checkpoint  //
                           // slow_first_step_s: once per process
  std::vector<float> losses_;
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRAINER_H_
