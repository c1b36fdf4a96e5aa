// MlpModel: a small next-token language model trained by ckpt-worker. Each
// input token is embedded (vocab V x dim D), passes through N residual blocks
// h += GELU(h W + b) (W is D x D), and is projected to V logits (D x V plus a
// bias); the loss is the mean softmax cross-entropy of the next token.
// Forward and backward are written out by hand; matrix products go through
// CBLAS sgemm, pinned to one thread so that a rerun is bitwise identical.
// The model owns fp32 working weights (filled by the caller each step) and
// the gradients of the last ForwardBackward. Not thread-safe.
#ifndef CKPT_WORKER_MLP_MODEL_H_
#define CKPT_WORKER_MLP_MODEL_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::worker {

struct MlpConfig {
  int vocab = 256;
  int dim = 64;
  int layers = 2;
  int seq = 32;    // predictions per sequence (a sequence holds seq + 1 tokens)
  int batch = 16;  // sequences per step
};

// InvalidArgument naming the field (vocab, dim, layers, seq, batch) when a
// size is out of range.
[[nodiscard]] absl::Status ValidateMlpConfig(const MlpConfig& config);

struct ParamShape {
  std::string name;  // "embed", "block0.w", "block0.b", ..., "out.w", "out.b"
  std::vector<int64_t> shape;
  size_t numel = 0;
};

// The parameter tensors in their fixed order.
std::vector<ParamShape> MlpParamShapes(const MlpConfig& config);

// Deterministic initial values of every parameter tensor from the seed.
std::vector<std::vector<float>> MlpInitialParams(const MlpConfig& config,
                                                 uint64_t seed);

// Limits the BLAS library to one thread when it has threads of its own
// (OpenBLAS); a no-op for the reference BLAS. Idempotent.
void PinBlasToOneThread();

class MlpModel {
 public:
  [[nodiscard]] static absl::StatusOr<MlpModel> Create(const MlpConfig& config);

  const MlpConfig& config() const { return config_; }
  size_t num_tensors() const { return weights_.size(); }
  std::span<float> weights(size_t tensor) { return weights_[tensor]; }
  std::span<const float> weights(size_t tensor) const {
    return weights_[tensor];
  }
  std::span<const float> gradients(size_t tensor) const {
    return grads_[tensor];
  }

  // Runs the batch (batch sequences of seq + 1 tokens, row after row) and
  // fills the gradients; returns the mean cross-entropy. InvalidArgument if
  // the batch has the wrong length or a token outside [0, vocab).
  // `stopped`, when given, is asked after the forward pass, after the loss
  // and after each layer of the backward pass: at its first true the call
  // returns Aborted (a restart was requested: the step will be thrown
  // away), its gradients incomplete; the next call overwrites them all.
  [[nodiscard]] absl::StatusOr<float> ForwardBackward(
      std::span<const int32_t> tokens,
      const std::function<bool()>& stopped = {});

 private:
  explicit MlpModel(const MlpConfig& config);
  void Forward(std::span<const int32_t> tokens);
  float LossAndLogitGradient(std::span<const int32_t> tokens);
  // False when `stopped` said so between two layers.
  bool Backward(std::span<const int32_t> tokens,
                const std::function<bool()>& stopped);

  MlpConfig config_;
  size_t rows_ = 0;  // batch * seq
  std::vector<std::vector<float>> weights_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>>
      hidden_;                           // layers + 1 activations, rows x dim
  std::vector<std::vector<float>> pre_;  // layers pre-GELU values, rows x dim
  std::vector<float> logits_;            // rows x vocab; then d loss / d logits
  std::vector<float> dh_, dh_next_, da_;  // rows x dim
};

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_MLP_MODEL_H_
