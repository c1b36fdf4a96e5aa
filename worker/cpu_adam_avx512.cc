// AVX-512F AdamW kernel; compiled with -mavx512f and only called after
// __builtin_cpu_supports("avx512f"). Operation order: see AdamElement.
#include <immintrin.h>

#include "worker/cpu_adam.h"

namespace ckpt::worker::avx512 {

namespace {

// FloatToBf16 for 16 lanes, packed to 16 x uint16.
inline __m256i ToBf16(__m512 p) {
  __m512i bits = _mm512_castps_si512(p);
  __m512i abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  __m512i lsb =
      _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
      16);
  __m512i quiet =
      _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

}  // namespace

void AdamKernel(const AdamStepScalars& s, const AdamSpan& span) {
  const __m512 beta1 = _mm512_set1_ps(s.beta1),
               omb1 = _mm512_set1_ps(s.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(s.beta2),
               omb2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(s.eps), decay = _mm512_set1_ps(s.decay);
  const __m512 step = _mm512_set1_ps(s.step_size),
               b2s = _mm512_set1_ps(s.bias2_sqrt);
  size_t i = 0;
  for (; i + 16 <= span.n; i += 16) {
    __m512 g = _mm512_loadu_ps(span.g + i);
    __m512 m = _mm512_add_ps(_mm512_mul_ps(beta1, _mm512_loadu_ps(span.m + i)),
                             _mm512_mul_ps(omb1, g));
    __m512 v = _mm512_add_ps(_mm512_mul_ps(beta2, _mm512_loadu_ps(span.v + i)),
                             _mm512_mul_ps(omb2, _mm512_mul_ps(g, g)));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), b2s), eps);
    __m512 p = _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(span.p + i), decay),
                             _mm512_mul_ps(step, _mm512_div_ps(m, denom)));
    _mm512_storeu_ps(span.m + i, m);
    _mm512_storeu_ps(span.v + i, v);
    _mm512_storeu_ps(span.p + i, p);
    if (span.p_bf16 != nullptr) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(span.p_bf16 + i),
                          ToBf16(p));
    }
  }
  AdamSpan tail{span.p + i,
                span.g + i,
                span.m + i,
                span.v + i,
                span.p_bf16 != nullptr ? span.p_bf16 + i : nullptr,
                span.n - i};
  AdamKernelScalar(s, tail);
}

}  // namespace ckpt::worker::avx512
