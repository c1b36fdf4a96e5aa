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
//
// ZeRO-1 (layout version 2): each rank holds only its slice of the
// flattened state (Zero1Bounds), so "param/<i>", "adam_m/<i>" and
// "adam_v/<i>" are saved as the pieces of the slice: 1-D, with a layout
// (global shape [numel of tensor i], the piece's offset in it); a rank
// whose slice misses tensor i saves none of it. Meta is whole on every
// rank. A restore asks for this run's slice with its layout, and
// Client::Restore reshards it from the saved pieces when the step was
// saved at another world size. Either mode restores the other's
// checkpoint (a job turns --zero1 on or off at a resume): a ZeRO-1 rank
// reads the whole tensors its slice touches and keeps its slice; a plain
// rank asks for each tensor whole in the 1-D layout of the pieces.
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
// A ZeRO-1 checkpoint: the state saved as 1-D pieces with layouts.
inline constexpr int64_t kZero1LayoutVersion = 2;

// The part of parameter tensor `tensor` a rank's optimizer holds:
// elements [offset, offset + numel) of its flattened values.
struct StatePiece {
  size_t tensor = 0;
  size_t offset = 0;
  size_t numel = 0;
};

// ZeRO-1's partition of `total` elements over `world` ranks: rank r owns
// the flattened elements [bounds[r], bounds[r + 1]), bounds[r] =
// floor(total r / world) (sizes differ by at most one).
std::vector<size_t> Zero1Bounds(size_t total, int world);
// The pieces of the parameter tensors that the flattened range [lo, hi)
// covers, in tensor order (tensors of `numels`, flattened one after the
// other); empty pieces left out.
std::vector<StatePiece> PiecesOf(const std::vector<size_t>& numels, size_t lo,
                                 size_t hi);

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
  // optimizer must outlive this object and hold MlpParamShapes(model) in
  // order (plain data parallel), or, with `zero1`, tensor j = pieces[j].
  TrainCheckpoint(const MlpConfig& model, int world_size,
                  ChunkedAdam* optimizer, bool zero1 = false,
                  std::vector<StatePiece> pieces = {});

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
  // saved rank's shard, whose meta must say that world size. ZeRO-1:
  // only from->world_size counts; this rank's slice is resharded from
  // every saved rank's pieces.
  [[nodiscard]] absl::StatusOr<RestoredState> Restore(
      Client& client, int64_t step,
      std::optional<SavedRank> from = std::nullopt);

 private:
  Tensor Meta(const char* name, int64_t* data, int64_t count);
  // A plain checkpoint into this ZeRO-1 rank's slice (of saved rank
  // from->rank when given).
  [[nodiscard]] absl::Status ReadSlicesOfWhole(Client& client, int64_t step,
                                               std::optional<SavedRank> from);
  // A ZeRO-1 checkpoint into this plain rank's whole state.
  [[nodiscard]] absl::Status ReadWholeFromPieces(Client& client, int64_t step);
  [[nodiscard]] absl::Status CheckMeta(int64_t step, int64_t world) const;

  const MlpConfig model_;
  const int world_size_;
  ChunkedAdam* const optimizer_;
  const bool zero1_;
  const std::vector<ParamShape> shapes_;
  const std::vector<StatePiece> pieces_;  // zero1_ only
  int64_t meta_step_[1] = {0};
  int64_t meta_rng_[2] = {0, 0};
  int64_t meta_model_[5] = {0, 0, 0, 0, 0};
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_TRAIN_CHECKPOINT_H_
