// The checkpoint layout of ckpt-worker and its two directions. A step's
// checkpoint holds, for every parameter tensor i of the model, its fp32
// master weights "param/<i>" and AdamW moments "adam_m/<i>", "adam_v/<i>"
// (the model's shape), plus three int64 tensors: "meta/step" [1] (optimizer
// steps taken), "meta/rng" [2] (data seed, data position) and "meta/model"
// [5] (layout version, vocab, dim, layers, world size). Saving hands libckpt
// views of the optimizer's own buffers, so nothing is copied twice; restoring
// reads meta first and refuses, before touching any weight, a checkpoint of
// another model or world size (unless restored as a saved rank of that
// world size: the state is the same on every rank). Not thread-safe; one
// per trainer.
#ifndef CKPT_WORKER_TRAIN_CHECKPOINT_H_
#define CKPT_WORKER_TRAIN_CHECKPOINT_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "ckpt/client.h"
#include "worker/chunked_adam.h"
#include "worker/mlp_model.h"

namespace ckpt::worker {

inline constexpr int64_t kCheckpointLayoutVersion = 1;

// A step saved at another world size (elastic continuation): the saved
// rank whose shard a rank restores, and the world size it was saved at.
// Data parallel: every rank's shard holds the whole model and optimizer.
struct SavedRank {
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

struct RestoredState {
  int64_t step = 0;
  uint64_t data_seed = 0;
};

class TrainCheckpoint {
 public:
  // optimizer must outlive this object and hold MlpParamShapes(model) in order.
  TrainCheckpoint(const MlpConfig& model, int world_size,
                  ChunkedAdam* optimizer);

  // The tensors of a save of `step`. They point into the optimizer's master
  // state and this object's meta buffers: both must stay untouched (no
  // optimizer Step, no other TensorsFor) until the save's WaitCopied.
  [[nodiscard]] absl::StatusOr<std::vector<Tensor>> TensorsFor(
      int64_t step, uint64_t data_seed);

  // Restores `step` into the optimizer. FailedPrecondition naming the field
  // when the checkpoint's model or world size differs from this run's; the
  // client's error (naming the tensor) when a tensor is missing or its shape
  // or checksum is wrong.
  // `from`: the step was saved at another world size; restores that
  // saved rank's shard, whose meta must say that world size.
  [[nodiscard]] absl::StatusOr<RestoredState> Restore(
      Client& client, int64_t step,
      std::optional<SavedRank> from = std::nullopt);

 private:
  Tensor Meta(const char* name, int64_t* data, int64_t count);
  [[nodiscard]] absl::Status CheckMeta(int64_t step, int64_t world) const;

  const MlpConfig model_;
  const int world_size_;
  ChunkedAdam* const optimizer_;
  const std::vector<ParamShape> shapes_;
  int64_t meta_step_[1] = {0};
  int64_t meta_rng_[2] = {0, 0};
  int64_t meta_model_[5] = {0, 0, 0, 0, 0};
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRAIN_CHECKPOINT_H_
