#include "worker/mlp_model.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/splitmix.h"

namespace ckpt::worker {

namespace {

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

absl::Status CheckRange(const char* field, int value, int lo, int hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = ", value, ": must be in [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// Row-major C (m x n) = alpha * op(A) op(B) + beta * C.
void Gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb,
              beta, c, ldc);
}

}  // namespace

absl::Status ValidateMlpConfig(const MlpConfig& c) {
  absl::Status s = CheckRange("vocab", c.vocab, 2, 1 << 20);
  if (s.ok()) s = CheckRange("dim", c.dim, 1, 1 << 14);
  if (s.ok()) s = CheckRange("layers", c.layers, 0, 256);
  if (s.ok()) s = CheckRange("seq", c.seq, 1, 1 << 16);
  if (s.ok()) s = CheckRange("batch", c.batch, 1, 1 << 16);
  if (!s.ok()) return s;
  uint64_t rows = uint64_t(c.seq) * uint64_t(c.batch);
  if (rows * uint64_t(std::max(c.vocab, c.dim)) > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch * seq * max(vocab, dim) = ",
                     rows * uint64_t(std::max(c.vocab, c.dim)),
                     ": activations above 2^30 floats"));
  }
  return absl::OkStatus();
}

std::vector<ParamShape> MlpParamShapes(const MlpConfig& c) {
  const int64_t v = c.vocab, d = c.dim;
  std::vector<ParamShape> out;
  out.push_back({"embed", {v, d}, size_t(v * d)});
  for (int l = 0; l < c.layers; ++l) {
    out.push_back({absl::StrCat("block", l, ".w"), {d, d}, size_t(d * d)});
    out.push_back({absl::StrCat("block", l, ".b"), {d}, size_t(d)});
  }
  out.push_back({"out.w", {d, v}, size_t(d * v)});
  out.push_back({"out.b", {v}, size_t(v)});
  return out;
}

std::vector<std::vector<float>> MlpInitialParams(const MlpConfig& c,
                                                 uint64_t seed) {
  std::vector<std::vector<float>> out;
  const float matrix_scale = 1.0f / std::sqrt(static_cast<float>(c.dim));
  uint64_t index = 0;
  for (const ParamShape& p : MlpParamShapes(c)) {
    SplitMix64 rng(seed * 0x9E3779B97F4A7C15ull + ++index);
    std::vector<float> values(p.numel, 0.0f);
    if (p.shape.size() == 2) {  // biases start at zero
      float scale = p.name == "embed"
                        ? 1.0f
                        : (p.name == "out.w" ? 1.0f : 0.5f) * matrix_scale;
      for (float& x : values) x = scale * (2.0f * rng.NextFloat() - 1.0f);
    }
    out.push_back(std::move(values));
  }
  return out;
}

void PinBlasToOneThread() {
  using SetThreads = void (*)(int);
  for (const char* symbol :
       {"openblas_set_num_threads", "goto_set_num_threads"}) {
    if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, symbol)))
      fn(1);
  }
}

absl::StatusOr<MlpModel> MlpModel::Create(const MlpConfig& config) {
  if (absl::Status s = ValidateMlpConfig(config); !s.ok()) return s;
  PinBlasToOneThread();
  return MlpModel(config);
}

MlpModel::MlpModel(const MlpConfig& c)
    : config_(c), rows_(size_t(c.batch) * c.seq) {
  for (const ParamShape& p : MlpParamShapes(c)) {
    weights_.emplace_back(p.numel, 0.0f);
    grads_.emplace_back(p.numel, 0.0f);
  }
  hidden_.assign(c.layers + 1, std::vector<float>(rows_ * c.dim));
  pre_.assign(c.layers, std::vector<float>(rows_ * c.dim));
  logits_.resize(rows_ * c.vocab);
  dh_.resize(rows_ * c.dim);
  dh_next_.resize(rows_ * c.dim);
  da_.resize(rows_ * c.dim);
}

absl::StatusOr<float> MlpModel::ForwardBackward(
    std::span<const int32_t> tokens, const std::function<bool()>& stopped) {
  const size_t want = size_t(config_.batch) * (config_.seq + 1);
  if (tokens.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: ", tokens.size(), " given, batch * (seq + 1) = ", want));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens[", i, "] = ", tokens[i], ": not in [0, ",
                       config_.vocab, ")"));
    }
  }
  auto aborted = [] {
    return absl::AbortedError(
        "a restart was requested during the step's compute");
  };
  Forward(tokens);
  if (stopped && stopped()) return aborted();
  float loss = LossAndLogitGradient(tokens);
  if (stopped && stopped()) return aborted();
  if (!Backward(tokens, stopped)) return aborted();
  return loss;
}

// Row r = (sequence b, position t) reads input token b*(seq+1)+t and
// predicts token b*(seq+1)+t+1.
void MlpModel::Forward(std::span<const int32_t> tokens) {
  const int d = config_.dim, v = config_.vocab, n = static_cast<int>(rows_);
  const float* embed = weights_[0].data();
  for (int b = 0, r = 0; b < config_.batch; ++b) {
    for (int t = 0; t < config_.seq; ++t, ++r) {
      int32_t tok = tokens[size_t(b) * (config_.seq + 1) + t];
      std::memcpy(&hidden_[0][size_t(r) * d], embed + size_t(tok) * d,
                  sizeof(float) * d);
    }
  }
  for (int l = 0; l < config_.layers; ++l) {
    const float* w = weights_[1 + 2 * l].data();
    const float* bias = weights_[2 + 2 * l].data();
    const std::vector<float>& in = hidden_[l];
    std::vector<float>& a = pre_[l];
    std::vector<float>& out = hidden_[l + 1];
    Gemm(false, false, n, d, d, in.data(), d, w, d, 0.0f, a.data(), d);
    for (size_t i = 0; i < a.size(); ++i) {
      float x = a[i] + bias[i % d];
      a[i] = x;
      float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
      out[i] = in[i] + 0.5f * x * (1.0f + t);
    }
  }
  const float* out_w = weights_[1 + 2 * config_.layers].data();
  const float* out_b = weights_[2 + 2 * config_.layers].data();
  Gemm(false, false, n, v, d, hidden_[config_.layers].data(), d, out_w, v, 0.0f,
       logits_.data(), v);
  for (size_t r = 0; r < rows_; ++r) {
    float* row = &logits_[r * v];
    for (int j = 0; j < v; ++j) row[j] += out_b[j];
  }
}

// Replaces the logits by d loss / d logits (softmax - one_hot) / rows.
float MlpModel::LossAndLogitGradient(std::span<const int32_t> tokens) {
  const int v = config_.vocab;
  double total = 0;
  const float inv_rows = 1.0f / static_cast<float>(rows_);
  for (int b = 0, r = 0; b < config_.batch; ++b) {
    for (int t = 0; t < config_.seq; ++t, ++r) {
      int32_t target = tokens[size_t(b) * (config_.seq + 1) + t + 1];
      float* row = &logits_[size_t(r) * v];
      float max = *std::max_element(row, row + v);
      float sum = 0;
      for (int j = 0; j < v; ++j) {
        row[j] = std::exp(row[j] - max);
        sum += row[j];
      }
      total += -std::log(row[target] / sum);
      for (int j = 0; j < v; ++j) row[j] = row[j] / sum * inv_rows;
      row[target] -= inv_rows;
    }
  }
  return static_cast<float>(total / static_cast<double>(rows_));
}

bool MlpModel::Backward(std::span<const int32_t> tokens,
                        const std::function<bool()>& stopped) {
  const int d = config_.dim, v = config_.vocab, n = static_cast<int>(rows_);
  const int L = config_.layers;
  const float* dlogits = logits_.data();
  // Output projection.
  Gemm(true, false, d, v, n, hidden_[L].data(), d, dlogits, v, 0.0f,
       grads_[1 + 2 * L].data(), v);
  std::vector<float>& dout_b = grads_[2 + 2 * L];
  std::fill(dout_b.begin(), dout_b.end(), 0.0f);
  for (size_t r = 0; r < rows_; ++r)
    for (int j = 0; j < v; ++j) dout_b[j] += dlogits[r * v + j];
  Gemm(false, true, n, d, v, dlogits, v, weights_[1 + 2 * L].data(), v, 0.0f,
       dh_.data(), d);
  // Residual blocks, last to first: h_out = h_in + gelu(h_in W + b).
  for (int l = L - 1; l >= 0; --l) {
    const std::vector<float>& a = pre_[l];
    for (size_t i = 0; i < a.size(); ++i) {
      float x = a[i];
      float t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
      float dt = (1.0f - t * t) * kGeluC * (1.0f + 3.0f * kGeluA * x * x);
      da_[i] = dh_[i] * (0.5f * (1.0f + t) + 0.5f * x * dt);
    }
    Gemm(true, false, d, d, n, hidden_[l].data(), d, da_.data(), d, 0.0f,
         grads_[1 + 2 * l].data(), d);
    std::vector<float>& db = grads_[2 + 2 * l];
    std::fill(db.begin(), db.end(), 0.0f);
    for (size_t i = 0; i < da_.size(); ++i) db[i % d] += da_[i];
    dh_next_ = dh_;
    Gemm(false, true, n, d, d, da_.data(), d, weights_[1 + 2 * l].data(), d,
         1.0f, dh_next_.data(), d);
    dh_.swap(dh_next_);
    if (stopped && stopped()) return false;
  }
  // Embedding rows, accumulated in row order so repeated tokens add up
  // deterministically.
  std::vector<float>& dembed = grads_[0];
  std::fill(dembed.begin(), dembed.end(), 0.0f);
  for (int b = 0, r = 0; b < config_.batch; ++b) {
    for (int t = 0; t < config_.seq; ++t, ++r) {
      int32_t tok = tokens[size_t(b) * (config_.seq + 1) + t];
      float* dst = &dembed[size_t(tok) * d];
      const float* src = &dh_[size_t(r) * d];
      for (int j = 0; j < d; ++j) dst[j] += src[j];
    }
  }
  return true;
}

}  // namespace ckpt::worker
