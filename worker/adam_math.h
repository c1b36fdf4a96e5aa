// AdamW (decoupled weight decay, bias-corrected) on fp32 master state, and
// the one definition of its per-element float operation order. The scalar,
// AVX2, AVX-512 and CUDA kernels all evaluate exactly AdamElement's sequence
// of IEEE-754 single-precision operations (multiply, add, divide, sqrt; never a
// fused multiply-add), each correctly rounded, so they agree bit for bit.
// Everything here is a pure function: safe to call from any thread.
#ifndef CKPT_WORKER_ADAM_MATH_H_
#define CKPT_WORKER_ADAM_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"

namespace ckpt::worker {

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// InvalidArgument naming the field unless lr >= 0, 0 <= beta < 1, eps > 0,
// weight_decay >= 0, all finite.
[[nodiscard]] absl::Status ValidateAdamConfig(const AdamConfig& config);

// The per-step scalars, derived once per step (in double, then rounded) so
// every kernel sees identical float constants.
struct AdamStepScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float decay;       // 1 - lr * weight_decay
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
};

// step counts from 1.
inline AdamStepScalars MakeStepScalars(const AdamConfig& c, int64_t step) {
  double t = static_cast<double>(step);
  AdamStepScalars s;
  s.beta1 = c.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  s.beta2 = c.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  s.eps = c.eps;
  s.decay = static_cast<float>(1.0 - double{c.lr} * c.weight_decay);
  s.step_size = static_cast<float>(c.lr / (1.0 - std::pow(double{c.beta1}, t)));
  s.bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(double{c.beta2}, t)));
  return s;
}

// Round-to-nearest-even fp32 -> bf16; NaN stays a quiet NaN of the same sign.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float Bf16ToFloat(uint16_t h) {
  uint32_t bits = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// The reference order of operations. Files that include this must be compiled
// with -ffp-contract=off (worker/CMakeLists.txt does so) so the compiler does
// not fuse a multiply and an add.
inline void AdamElement(const AdamStepScalars& s, float& p, float g, float& m,
                        float& v) {
  float m1 = s.beta1 * m + s.one_minus_beta1 * g;
  float v1 = s.beta2 * v + s.one_minus_beta2 * (g * g);
  float denom = std::sqrt(v1) / s.bias2_sqrt + s.eps;
  p = p * s.decay - s.step_size * (m1 / denom);
  m = m1;
  v = v1;
}

// The same update in double precision from the unrounded hyper-parameters:
// the yardstick the float kernels are tested against.
inline void AdamElementDouble(const AdamConfig& c, int64_t step, double& p,
                              double g, double& m, double& v) {
  double t = static_cast<double>(step);
  m = c.beta1 * m + (1.0 - c.beta1) * g;
  v = c.beta2 * v + (1.0 - c.beta2) * g * g;
  double m_hat = m / (1.0 - std::pow(double{c.beta1}, t));
  double v_hat = v / (1.0 - std::pow(double{c.beta2}, t));
  p = p * (1.0 - double{c.lr} * c.weight_decay) -
      c.lr * m_hat / (std::sqrt(v_hat) + c.eps);
}

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_ADAM_MATH_H_
