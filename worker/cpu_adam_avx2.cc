// AVX2 AdamW kernel; compiled with -mavx2 and only called after
// __builtin_cpu_supports("avx2"). No FMA: the operation order is AdamElement's.
#include <immintrin.h>

#include "worker/cpu_adam.h"

namespace ckpt::worker::avx2 {

namespace {

// FloatToBf16 for 8 lanes, packed to 8 x uint16.
inline __m128i ToBf16(__m256 p) {
  __m256i bits = _mm256_castps_si256(p);
  __m256i abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
      16);
  __m256i quiet =
      _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  __m256i chosen = _mm256_blendv_epi8(rounded, quiet, nan);
  __m256i packed =
      _mm256_permute4x64_epi64(_mm256_packus_epi32(chosen, chosen), 0xD8);
  return _mm256_castsi256_si128(packed);
}

}  // namespace

void AdamKernel(const AdamStepScalars& s, const AdamSpan& span) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1),
               omb1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2),
               omb2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(s.eps), decay = _mm256_set1_ps(s.decay);
  const __m256 step = _mm256_set1_ps(s.step_size),
               b2s = _mm256_set1_ps(s.bias2_sqrt);
  size_t i = 0;
  for (; i + 8 <= span.n; i += 8) {
    __m256 g = _mm256_loadu_ps(span.g + i);
    __m256 m = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(span.m + i)),
                             _mm256_mul_ps(omb1, g));
    __m256 v = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(span.v + i)),
                             _mm256_mul_ps(omb2, _mm256_mul_ps(g, g)));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), b2s), eps);
    __m256 p = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(span.p + i), decay),
                             _mm256_mul_ps(step, _mm256_div_ps(m, denom)));
    _mm256_storeu_ps(span.m + i, m);
    _mm256_storeu_ps(span.v + i, v);
    _mm256_storeu_ps(span.p + i, p);
    if (span.p_bf16 != nullptr) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(span.p_bf16 + i), ToBf16(p));
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

}  // namespace ckpt::worker::avx2
