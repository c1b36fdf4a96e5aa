#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "util/checksum.h"
#include "util/status.h"
#include "worker/phase_trace.h"
#include "worker/synthetic_data.h"

namespace ckpt::worker {
namespace {

// steady_clock is CLOCK_MONOTONIC on Linux: the coordinator's event clock.
long long MonotonicMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status ValidateTrainerOptions(const TrainerOptions& o) {
  CKPT_RETURN_IF_ERROR(ValidateMlpConfig(o.model));
  if (o.steps < 0 || o.steps > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps = ", o.steps, ": must be in [0, 2^40]"));
  }
  if (o.ckpt_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ckpt_every = ", o.ckpt_every, ": negative"));
  }
  CKPT_RETURN_IF_ERROR(ValidateOffloadFraction(o.offload_fraction));
  if (!std::isfinite(o.lr) || o.lr <= 0 || o.lr > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr = ", o.lr, ": must be in (0, 1]"));
  }
  if (o.log_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("log_every = ", o.log_every, ": negative"));
  }
  if (o.cpu_threads < 1 || o.cpu_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cpu_threads = ", o.cpu_threads, ": must be in [1, 1024]"));
  }
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", o.world_size, ": not positive"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank = ", o.rank, ": not in [0, world_size ", o.world_size, ")"));
  }
  if (!std::isfinite(o.fault_slow_factor) || o.fault_slow_factor < 1 ||
      o.fault_slow_factor > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fault_slow_factor = ", o.fault_slow_factor, ": must be in [1, 100]"));
  }
  if (o.fault_slow_rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault_slow_rank = ", o.fault_slow_rank,
                     ": no such rank in world_size ", o.world_size));
  }
  if (!std::isfinite(o.slow_first_step_s) || o.slow_first_step_s < 0 ||
      o.slow_first_step_s > 3600) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slow_first_step_s = ", o.slow_first_step_s, ": must be in [0, 3600]"));
  }
  if (o.eval_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_every = ", o.eval_every, ": negative"));
  }
  if (!std::isfinite(o.eval_s) || o.eval_s <= 0 || o.eval_s > 3600) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval_s = ", o.eval_s, ": must be in (0, 3600]"));
  }
  if (o.zero1) {
    size_t total = 0;
    for (const ParamShape& p : MlpParamShapes(o.model)) total += p.numel;
    if (total < static_cast<size_t>(o.world_size))
      return absl::InvalidArgumentError(absl::StrCat(
          "world_size = ", o.world_size, ": zero1 gives each rank a slice of ",
          "the ", total, " parameters, fewer than the ranks"));
  }
  if (o.model.batch % o.world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch = ", o.model.batch,
        ": the global batch must split evenly over world_size ", o.world_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    const TrainerOptions& options, std::unique_ptr<Client> client,
    std::unique_ptr<DataParallel> comm) {
  CKPT_RETURN_IF_ERROR(ValidateTrainerOptions(options));
  if (options.world_size > 1 &&
      (comm == nullptr || comm->rank() != options.rank ||
       comm->world_size() != options.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options.rank, " of world_size ", options.world_size,
        ": needs a DataParallel connection of the same rank and world size"));
  }
  MlpConfig local = options.model;
  local.batch = options.model.batch / options.world_size;  // this rank's slice
  CKPT_ASSIGN_OR_RETURN(MlpModel model, MlpModel::Create(local));
  std::unique_ptr<Trainer> t(new Trainer(options, std::move(client),
                                         std::move(comm), std::move(model)));
  CKPT_RETURN_IF_ERROR(t->Initialize());
  return t;
}

Trainer::Trainer(const TrainerOptions& options, std::unique_ptr<Client> client,
                 std::unique_ptr<DataParallel> comm, MlpModel model)
    : options_(options),
      client_(std::move(client)),
      comm_(std::move(comm)),
      model_(std::move(model)),
      data_seed_(options.seed) {}

Trainer::~Trainer() {
  // A save still copying reads the optimizer's buffers: finish it first.
  if (pending_save_.has_value()) pending_save_->Wait().IgnoreError();
}

absl::Status Trainer::Initialize() {
  const std::vector<ParamShape> shapes = MlpParamShapes(options_.model);
  std::vector<size_t> numels;
  size_t total = 0;
  for (const ParamShape& p : shapes) {
    tensor_start_.push_back(total);
    numels.push_back(p.numel);
    total += p.numel;
  }
  if (options_.zero1) {
    // The slice of the flattened state this rank owns; the optimizer
    // holds its pieces only.
    const auto rank = static_cast<size_t>(options_.rank);
    bounds_ = Zero1Bounds(total, options_.world_size);
    for (int r = 0; r < options_.world_size; ++r)
      counts_.push_back(bounds_[r + 1] - bounds_[r]);
    pieces_ = PiecesOf(numels, bounds_[rank], bounds_[rank + 1]);
    working_bf16_.resize(total);
    mine_bf16_.resize(counts_[rank]);
  } else {
    for (size_t i = 0; i < shapes.size(); ++i)
      pieces_.push_back({i, 0, numels[i]});
  }
  std::vector<TensorSpec> specs;
  size_t largest = 0;
  for (const StatePiece& p : pieces_) {
    specs.push_back({options_.zero1
                         ? absl::StrCat(shapes[p.tensor].name, ".", p.offset)
                         : shapes[p.tensor].name,
                     p.numel});
    largest = std::max(largest, p.numel);
  }
  // One chunk per big matrix (or piece); the small ones share chunks.
  ChunkedAdamOptions opt;
  opt.adam.lr = options_.lr;
  opt.chunk_elems = largest;
  opt.offload_fraction = options_.offload_fraction;
  opt.cpu_threads = options_.cpu_threads;
  CKPT_ASSIGN_OR_RETURN(ChunkLayout layout, NextFitLayout(specs, largest));
  DeviceFootprint f = FootprintOf(layout.num_chunks(), layout.chunk_elems);
  size_t resident =
      StaticResidentChunks(options_.offload_fraction, layout.num_chunks());
  device_ = std::make_unique<HostBudgetDevice>(
      f.fixed_bytes + resident * f.resident_chunk_bytes);
  CKPT_ASSIGN_OR_RETURN(optimizer_,
                        ChunkedAdam::Create(device_.get(), specs, opt));
  std::vector<std::vector<float>> init =
      MlpInitialParams(options_.model, options_.seed);
  for (size_t j = 0; j < pieces_.size(); ++j) {
    const StatePiece& p = pieces_[j];
    CKPT_RETURN_IF_ERROR(optimizer_->SetParams(
        j, std::span<const float>(init[p.tensor].data() + p.offset, p.numel)));
  }
  bf16_scratch_.resize(largest);
  if (options_.world_size > 1) reduce_buffer_.resize(total + 1);
  checkpoint_ = std::make_unique<TrainCheckpoint>(
      options_.model, options_.world_size, optimizer_.get(), options_.zero1,
      pieces_);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::Restore(std::optional<int64_t> step,
                                         std::optional<SavedRank> from) {
  if (from && !step)
    return absl::InvalidArgumentError(
        "restore of a saved rank: needs the step it was saved at");
  CKPT_ASSIGN_OR_RETURN(int64_t start, RestoreThisRank(step, from));
  Phase("restored_own", options_.rank);
  CKPT_RETURN_IF_ERROR(CheckRanksAgree("after restore"));
  return start;
}

absl::StatusOr<int64_t> Trainer::RestoreThisRank(
    std::optional<int64_t> step, std::optional<SavedRank> from) {
  if (client_ == nullptr) {
    if (step.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "restore step ", *step, ": no checkpoint daemon to restore from"));
    }
    return step_;
  }
  int64_t target = 0;
  if (step.has_value()) {
    target = *step;
  } else {
    absl::StatusOr<int64_t> latest = client_->LatestStep();
    if (absl::IsNotFound(latest.status())) return step_;  // a fresh job
    if (!latest.ok())
      return Annotate(latest.status(), "finding the latest checkpoint");
    target = *latest;
  }
  CKPT_ASSIGN_OR_RETURN(RestoredState r,
                        checkpoint_->Restore(*client_, target, from));
  step_ = r.step;
  data_seed_ = r.data_seed;
  restored_ = true;
  working_step_ = -1;  // the restored weights are not the gathered ones
  return step_;
}

std::optional<int64_t> Trainer::LeaveGeneration() {
  std::optional<int64_t> in_flight;
  if (pending_save_.has_value()) {
    in_flight = pending_save_step_;
    // Its outcome no longer matters: the next generation restores a step
    // the plan names.
    pending_save_->Wait().IgnoreError();
    pending_save_.reset();
  }
  Phase("leave_save_done", options_.rank);
  comm_.reset();
  Phase("leave_comm_reset", options_.rank);
  client_.reset();
  Phase("leave_client_reset", options_.rank);
  return in_flight;
}

absl::StatusOr<int64_t> Trainer::JoinGeneration(
    std::unique_ptr<Client> client, std::unique_ptr<DataParallel> comm,
    int64_t step) {
  if (options_.world_size > 1 &&
      (comm == nullptr || comm->rank() != options_.rank ||
       comm->world_size() != options_.world_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options_.rank, " of world_size ", options_.world_size,
        ": a new generation needs a connection of the same rank and world "
        "size"));
  }
  client_ = std::move(client);
  comm_ = std::move(comm);
  return Restore(step);
}

absl::Status Trainer::GatherWorkingWeights() {
  if (working_step_ == optimizer_->step()) return absl::OkStatus();
  size_t at = 0;
  for (size_t j = 0; j < pieces_.size(); ++j) {
    CKPT_RETURN_IF_ERROR(optimizer_->GetParamsBf16(
        j, std::span<uint16_t>(mine_bf16_.data() + at, pieces_[j].numel)));
    at += pieces_[j].numel;
  }
  if (options_.world_size == 1) {
    working_bf16_ = mine_bf16_;
  } else if (comm_ == nullptr) {
    return absl::FailedPreconditionError(
        "gathering the working weights: no connection to the other ranks");
  } else if (absl::Status s =
                 comm_->AllGatherV(mine_bf16_, working_bf16_, counts_);
             !s.ok()) {
    return Annotate(s, absl::StrCat("after step ", step_,
                                    ": all-gather of the working weights"));
  }
  working_step_ = optimizer_->step();
  return absl::OkStatus();
}

absl::Status Trainer::LoadWorkingWeights() {
  if (options_.zero1) {
    CKPT_RETURN_IF_ERROR(GatherWorkingWeights());
    for (size_t i = 0; i < model_.num_tensors(); ++i) {
      std::span<float> w = model_.weights(i);
      const uint16_t* src = working_bf16_.data() + tensor_start_[i];
      for (size_t j = 0; j < w.size(); ++j) w[j] = Bf16ToFloat(src[j]);
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < model_.num_tensors(); ++i) {
    std::span<float> w = model_.weights(i);
    std::span<uint16_t> bf16(bf16_scratch_.data(), w.size());
    CKPT_RETURN_IF_ERROR(optimizer_->GetParamsBf16(i, bf16));
    for (size_t j = 0; j < w.size(); ++j) w[j] = Bf16ToFloat(bf16[j]);
  }
  return absl::OkStatus();
}

absl::Status Trainer::FinishSave(bool wait_daemon) {
  if (!pending_save_.has_value()) return absl::OkStatus();
  absl::Status s =
      wait_daemon ? pending_save_->Wait() : pending_save_->WaitCopied();
  if (!s.ok() || wait_daemon) pending_save_.reset();
  return s.ok() ? s : Annotate(s, "checkpoint save");
}

absl::Status Trainer::ReduceGradients(float& loss) {
  if (comm_ == nullptr || options_.world_size == 1) {
    if (options_.zero1) {
      for (size_t j = 0; j < pieces_.size(); ++j) {
        const StatePiece& p = pieces_[j];
        CKPT_RETURN_IF_ERROR(optimizer_->SetGradients(
            j, model_.gradients(p.tensor).subspan(p.offset, p.numel)));
      }
      return absl::OkStatus();
    }
    for (size_t i = 0; i < model_.num_tensors(); ++i) {
      CKPT_RETURN_IF_ERROR(optimizer_->SetGradients(i, model_.gradients(i)));
    }
    return absl::OkStatus();
  }
  // One allreduce over all tensors: fewer, larger ring transfers.
  float* at = reduce_buffer_.data();
  for (size_t i = 0; i < model_.num_tensors(); ++i) {
    std::span<const float> g = model_.gradients(i);
    std::copy(g.begin(), g.end(), at);
    at += g.size();
  }
  *at = loss;
  if (absl::Status s = comm_->AllReduceMean(reduce_buffer_); !s.ok()) {
    return Annotate(s,
                    absl::StrCat("step ", step_ + 1, ": gradient allreduce"));
  }
  loss = reduce_buffer_.back();
  if (options_.zero1) {
    // The whole gradient is reduced (one ring allreduce, as plain data
    // parallel: the same bits); this rank's optimizer takes its slice.
    for (size_t j = 0; j < pieces_.size(); ++j) {
      const StatePiece& p = pieces_[j];
      CKPT_RETURN_IF_ERROR(optimizer_->SetGradients(
          j, std::span<const float>(
                 reduce_buffer_.data() + tensor_start_[p.tensor] + p.offset,
                 p.numel)));
    }
    return absl::OkStatus();
  }
  at = reduce_buffer_.data();
  for (size_t i = 0; i < model_.num_tensors(); ++i) {
    size_t n = model_.gradients(i).size();
    CKPT_RETURN_IF_ERROR(
        optimizer_->SetGradients(i, std::span<const float>(at, n)));
    at += n;
  }
  loss = *at;
  return absl::OkStatus();
}

absl::Status Trainer::CheckRanksAgree(const char* when) {
  if (comm_ == nullptr || options_.world_size == 1) return absl::OkStatus();
  CKPT_ASSIGN_OR_RETURN(uint64_t digest, ParamsDigest());
  CKPT_ASSIGN_OR_RETURN(std::vector<uint64_t> steps,
                        comm_->AllGather(static_cast<uint64_t>(step_)));
  CKPT_ASSIGN_OR_RETURN(std::vector<uint64_t> digests,
                        comm_->AllGather(digest));
  for (int r = 1; r < options_.world_size; ++r) {
    if (steps[r] != steps[0] || digests[r] != digests[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          when, ": ranks differ: rank 0 is at step ", steps[0],
          " with params digest ", absl::Hex(digests[0], absl::kZeroPad16),
          ", rank ", r, " at step ", steps[r], " with params digest ",
          absl::Hex(digests[r], absl::kZeroPad16)));
    }
  }
  return absl::OkStatus();
}

void Trainer::HangForever(int64_t step) {
  std::fprintf(stderr,
               "ckpt-worker rank=%d: --fault-hang: blocking forever in "
               "step %lld\n",
               options_.rank, static_cast<long long>(step));
  for (;;) ::pause();
}

double Trainer::SlowDown(double compute_s) const {
  if (options_.rank != options_.fault_slow_rank) return compute_s;
  const double extra = (options_.fault_slow_factor - 1) * compute_s;
  std::this_thread::sleep_for(std::chrono::duration<double>(extra));
  return compute_s + extra;
}

absl::Status Trainer::Evaluate(int64_t step, std::FILE* log) {
  if (client_ != nullptr)
    client_->ExpectPause(options_.eval_s,
                         absl::StrCat("evaluation after step ", step));
  CKPT_RETURN_IF_ERROR(LoadWorkingWeights());  // the weights after `step`
  // Held-out data: the same patterns, batches no training step draws
  // (steps count up from 1; these count down from -1). Only the working
  // weights and the gradient buffers are used, both rewritten by the next
  // step before they are read.
  SyntheticData data{options_.model.vocab, options_.model.seq,
                     options_.model.batch, data_seed_};
  const size_t row = static_cast<size_t>(options_.model.seq) + 1;
  const size_t rows =
      static_cast<size_t>(options_.model.batch / options_.world_size);
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::duration<double>(options_.eval_s);
  double sum = 0;
  int64_t batches = 0;
  do {
    std::vector<int32_t> global = MakeBatch(data, -1 - batches, /*rank=*/0);
    std::span<const int32_t> tokens(global.data() + options_.rank * rows * row,
                                    rows * row);
    CKPT_ASSIGN_OR_RETURN(float loss, model_.ForwardBackward(tokens));
    sum += loss;
    ++batches;
    // A restart does not wait for the evaluation to run its course.
  } while (std::chrono::steady_clock::now() < until &&
           !(stop_ != nullptr && stop_->load()));
  if (log != nullptr) {
    std::fprintf(log, "eval step %lld loss %.4f batches %lld\n",
                 static_cast<long long>(step), sum / batches,
                 static_cast<long long>(batches));
    std::fflush(log);
  }
  return absl::OkStatus();
}

absl::Status Trainer::RunUntil(int64_t last_step, std::FILE* log) {
  last_step = std::min(last_step, options_.steps);
  // The global batch; this rank trains on its contiguous slice of rows.
  SyntheticData data{options_.model.vocab, options_.model.seq,
                     options_.model.batch, data_seed_};
  const size_t row = static_cast<size_t>(options_.model.seq) + 1;
  const size_t rows =
      static_cast<size_t>(options_.model.batch / options_.world_size);
  while (step_ < last_step) {
    const int64_t s = step_ + 1;
    if (stop_ != nullptr && stop_->load()) {
      return absl::AbortedError(
          absl::StrCat("a restart was requested before step ", s));
    }
    CKPT_RETURN_IF_ERROR(LoadWorkingWeights());
    std::vector<int32_t> global = MakeBatch(data, s, /*rank=*/0);
    std::span<const int32_t> tokens(global.data() + options_.rank * rows * row,
                                    rows * row);
    if (s == options_.fault_hang_step &&
        options_.rank == options_.fault_hang_rank && !restored_)
      HangForever(s);
    if (!first_step_done_ && options_.slow_first_step_s > 0)
      std::this_thread::sleep_for(
          std::chrono::duration<double>(options_.slow_first_step_s));
    first_step_done_ = true;
    Phase("step_begin", options_.rank);
    const auto compute_start = std::chrono::steady_clock::now();
    // A restart requested meanwhile: the step is thrown away, so its
    // compute stops at the next layer instead of running its course.
    CKPT_ASSIGN_OR_RETURN(float loss, model_.ForwardBackward(tokens, [this] {
      return stop_ != nullptr && stop_->load(std::memory_order_relaxed);
    }));
    const double compute_s =
        SlowDown(std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - compute_start)
                     .count());
    // The beacon after this rank's own work, before it waits for the
    // others: a rank stuck in its compute stays behind the ranks waiting
    // for it in the allreduce, and is the one named.
    if (client_ != nullptr) client_->Progress(s, compute_s);
    Phase("compute_done", options_.rank);
    CKPT_RETURN_IF_ERROR(ReduceGradients(loss));
    Phase("reduced", options_.rank);
    // The last save reads the master weights the step is about to rewrite.
    CKPT_RETURN_IF_ERROR(FinishSave(/*wait_daemon=*/false));
    CKPT_RETURN_IF_ERROR(optimizer_->Step());
    step_ = s;
    losses_.push_back(loss);
    if (client_ != nullptr && options_.ckpt_every > 0 &&
        s % options_.ckpt_every == 0) {
      CKPT_RETURN_IF_ERROR(FinishSave(/*wait_daemon=*/true));
      CKPT_ASSIGN_OR_RETURN(std::vector<Tensor> tensors,
                            checkpoint_->TensorsFor(s, data_seed_));
      absl::StatusOr<SaveHandle> h = client_->SaveAsync(s, tensors);
      if (!h.ok())
        return Annotate(h.status(),
                        absl::StrCat("checkpoint save of step ", s));
      pending_save_ = *std::move(h);
      pending_save_step_ = s;
    }
    if (log != nullptr && options_.log_every > 0 &&
        (s % options_.log_every == 0 || s == options_.steps)) {
      if (options_.log_mono) {
        std::fprintf(log, "step %lld loss %.4f rank=%d mono_ms=%lld\n",
                     static_cast<long long>(s), loss, options_.rank,
                     MonotonicMs());
      } else {
        std::fprintf(log, "step %lld loss %.4f\n", static_cast<long long>(s),
                     loss);
      }
      std::fflush(log);
    }
    if (options_.eval_every > 0 && s % options_.eval_every == 0)
      CKPT_RETURN_IF_ERROR(Evaluate(s, log));
  }
  CKPT_RETURN_IF_ERROR(FinishSave(/*wait_daemon=*/true));
  return CheckRanksAgree(absl::StrCat("after step ", step_).c_str());
}

std::string Trainer::PartitionSummary() const {
  if (!options_.zero1) return "";
  const auto rank = static_cast<size_t>(options_.rank);
  return absl::StrCat("zero1 rank ", options_.rank, " of ", options_.world_size,
                      " owns elements [", bounds_[rank], ", ",
                      bounds_[rank + 1], ") of ", bounds_.back(), " in ",
                      pieces_.size(), " pieces, ",
                      optimizer_->layout().num_chunks(), " chunks");
}

absl::StatusOr<uint64_t> Trainer::ParamsDigest() const {
  if (options_.zero1) {
    // Every rank's slice of the master weights, gathered: the flattened
    // tensors in order, as plain data parallel hashes them.
    std::vector<float> mine(counts_[static_cast<size_t>(options_.rank)]);
    size_t at = 0;
    for (size_t j = 0; j < pieces_.size(); ++j) {
      CKPT_RETURN_IF_ERROR(optimizer_->GetParams(
          j, std::span<float>(mine.data() + at, pieces_[j].numel)));
      at += pieces_[j].numel;
    }
    std::vector<float> all(bounds_.back());
    if (options_.world_size == 1) {
      all = std::move(mine);
    } else if (comm_ == nullptr) {
      return absl::FailedPreconditionError(
          "params digest: no connection to the other ranks");
    } else {
      CKPT_RETURN_IF_ERROR(comm_->AllGatherV(mine, all, counts_));
    }
    return Hash64(all.data(), all.size() * sizeof(float));
  }
  std::vector<float> all;
  for (size_t i = 0; i < model_.num_tensors(); ++i) {
    size_t at = all.size();
    all.resize(at + std::as_const(model_).weights(i).size());
    CKPT_RETURN_IF_ERROR(optimizer_->GetParams(
        i, std::span<float>(all.data() + at, all.size() - at)));
  }
  return Hash64(all.data(), all.size() * sizeof(float));
}

}  // namespace ckpt::worker
