// Attention of a few query rows over a KV cache (a draft model's decode step), grouped-query heads; raw pointers.
// One call = one query row of one head: out = softmax(scale * q k^T + mask) v, fp32 (fp64 for double) throughout.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "specdec/common.h"
#include "specdec/linear.h"

namespace specdec {

// bf16 bits or a float type, read as the accumulation type
template <typename Acc>
inline Acc load_as(uint16_t x) {
  return static_cast<Acc>(bf16_to_float(x));
}
template <typename Acc>
inline Acc load_as(float x) {
  return static_cast<Acc>(x);
}
template <typename Acc>
inline Acc load_as(double x) {
  return static_cast<Acc>(x);
}
inline void store_as(float x, uint16_t* out) { *out = float_to_bf16(x); }
inline void store_as(float x, float* out) { *out = x; }
inline void store_as(double x, double* out) { *out = x; }

template <typename T, typename Acc>
void decode_attention_row(const T* q,        // [D]
                          const T* k,        // [S, D] rows of the query's KV head
                          const T* v,        // [S, D]
                          const float* mask, // [S] additive
                          int64_t s_len, int64_t dim, Acc scale,
                          Acc* scores,       // [S] scratch
                          Acc* acc,          // [D] scratch
                          T* out) {          // [D]
  Acc top = -std::numeric_limits<Acc>::infinity();
  for (int64_t s = 0; s < s_len; ++s) {
    const T* ks = k + s * dim;
    Acc lanes[kLinearLanes] = {};
    int64_t d = 0;
    for (; d + kLinearLanes <= dim; d += kLinearLanes)
      for (int l = 0; l < kLinearLanes; ++l) lanes[l] += load_as<Acc>(q[d + l]) * load_as<Acc>(ks[d + l]);
    Acc dot = 0;
    for (int l = 0; l < kLinearLanes; ++l) dot += lanes[l];
    for (; d < dim; ++d) dot += load_as<Acc>(q[d]) * load_as<Acc>(ks[d]);
    const Acc x = dot * scale + static_cast<Acc>(mask[s]);
    scores[s] = x;
    top = x > top ? x : top;
  }
  Acc total = 0;
  for (int64_t s = 0; s < s_len; ++s) {
    scores[s] = std::exp(scores[s] - top);  // a row masked everywhere with -inf gives NaN, as softmax does
    total += scores[s];
  }
  for (int64_t d = 0; d < dim; ++d) acc[d] = 0;
  for (int64_t s = 0; s < s_len; ++s) {
    const Acc p = scores[s] / total;
    const T* vs = v + s * dim;
    for (int64_t d = 0; d < dim; ++d) acc[d] += p * load_as<Acc>(vs[d]);
  }
  for (int64_t d = 0; d < dim; ++d) store_as(acc[d], out + d);
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bf16 rows with D a multiple of 32 (64 here): VDPBF16PS dot products (32 products per instruction), the weighted
// sum of v in fp32 vectors of 16. Same math as decode_attention_row, other summation order.
inline void decode_attention_row_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* mask,
                                      int64_t s_len, int64_t dim, float scale, float* scores, float* acc,
                                      uint16_t* out) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < s_len; ++s) {
    const uint16_t* ks = k + s * dim;
    __m512 a = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 32)
      a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(q + d), (__m512bh)_mm512_loadu_si512(ks + d));
    const float x = _mm512_reduce_add_ps(a) * scale + mask[s];
    scores[s] = x;
    top = x > top ? x : top;
  }
  float total = 0;
  for (int64_t s = 0; s < s_len; ++s) {
    scores[s] = std::exp(scores[s] - top);
    total += scores[s];
  }
  for (int64_t d0 = 0; d0 < dim; d0 += 16) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t s = 0; s < s_len; ++s) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + s * dim + d0));
      const __m512 vs = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      sum = _mm512_add_ps(sum, _mm512_mul_ps(_mm512_set1_ps(scores[s] / total), vs));
    }
    _mm512_storeu_ps(acc + d0, sum);
  }
  for (int64_t d = 0; d < dim; ++d) out[d] = float_to_bf16(acc[d]);
}
#elif defined(SPECDEC_LINEAR_AVX2)
// AVX2 + FMA (no bf16 dot products), bf16 rows with D a multiple of 8 and at most 128: q widened once into
// registers, four cache slots' dot products at a time (four independent FMA chains, one horizontal reduction for
// the four), the weighted sum of v in up to 16 fp32 vectors. The generic loop's scalar 16-lane reductions cost
// ~50 ns per slot here, 10x this. Same math as decode_attention_row, other summation order.
constexpr int64_t kAttentionMaxDimAvx2 = 128;

inline __m128 sum_lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {  // [sum a0, sum a1, sum a2, sum a3]
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

inline void decode_attention_row_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* mask,
                                      int64_t s_len, int64_t dim, float scale, float* scores, float* acc,
                                      uint16_t* out) {
  const int64_t chunks = dim / 8;
  __m256 qv[kAttentionMaxDimAvx2 / 8];
  for (int64_t c = 0; c < chunks; ++c) qv[c] = widen_bf16x8(q + 8 * c);
  float top = -std::numeric_limits<float>::infinity();
  int64_t s = 0;
  for (; s + 4 <= s_len; s += 4) {
    const uint16_t* ks = k + s * dim;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t c = 0; c < chunks; ++c) {
      a0 = _mm256_fmadd_ps(qv[c], widen_bf16x8(ks + 8 * c), a0);
      a1 = _mm256_fmadd_ps(qv[c], widen_bf16x8(ks + dim + 8 * c), a1);
      a2 = _mm256_fmadd_ps(qv[c], widen_bf16x8(ks + 2 * dim + 8 * c), a2);
      a3 = _mm256_fmadd_ps(qv[c], widen_bf16x8(ks + 3 * dim + 8 * c), a3);
    }
    float dots[4];
    _mm_storeu_ps(dots, sum_lanes4(a0, a1, a2, a3));
    for (int j = 0; j < 4; ++j) {
      const float x = dots[j] * scale + mask[s + j];
      scores[s + j] = x;
      top = x > top ? x : top;
    }
  }
  for (; s < s_len; ++s) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) a = _mm256_fmadd_ps(qv[c], widen_bf16x8(k + s * dim + 8 * c), a);
    const float x = sum_lanes(a) * scale + mask[s];
    scores[s] = x;
    top = x > top ? x : top;
  }
  float total = 0;
  for (s = 0; s < s_len; ++s) {
    scores[s] = std::exp(scores[s] - top);  // a row masked everywhere with -inf gives NaN, as softmax does
    total += scores[s];
  }
  __m256 sum[kAttentionMaxDimAvx2 / 8];
  for (int64_t c = 0; c < chunks; ++c) sum[c] = _mm256_setzero_ps();
  for (s = 0; s < s_len; ++s) {
    const __m256 p = _mm256_set1_ps(scores[s] / total);
    for (int64_t c = 0; c < chunks; ++c) sum[c] = _mm256_fmadd_ps(p, widen_bf16x8(v + s * dim + 8 * c), sum[c]);
  }
  for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(acc + 8 * c, sum[c]);
  for (int64_t d = 0; d < dim; ++d) out[d] = float_to_bf16(acc[d]);
}
#endif

}  // namespace specdec
