// Elementwise layers of a Llama decode step on raw pointers: RMSNorm and the rotary position embedding, one row per
// call. A bf16/fp16 torch op computes in fp32 and rounds its result to the dtype once, so these kernels round after
// every op of HF's formula (specdec_kernels/reference/decode.py) and reproduce its bits; rms_norm differs only in the
// summation order of its mean of squares.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
#include <immintrin.h>
#endif

#include "specdec/common.h"
#include "specdec/linear.h"  // bf16_to_float, float_to_bf16

namespace specdec {

// IEEE fp16 <-> fp32 without F16C (round to nearest even, subnormals kept, as c10::Half and the F16C instructions):
// the exponent is rebiased by a multiply by a power of two, so the hardware rounds the mantissa.
inline float half_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16, sign = w & 0x80000000u, two_w = w + w;
  const float normal = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;  // also inf and NaN
  const float subnormal = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  return float_of(sign | (two_w < (1u << 27) ? bits_of(subnormal) : bits_of(normal)));
}

inline uint16_t float_to_half(float f) {
  const uint32_t w = bits_of(f), two_w = w + w, sign = w & 0x80000000u;
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;  // past fp16's range: inf
  uint32_t bias = two_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;  // this sum rounds at fp16's last mantissa bit
  const uint32_t bits = bits_of(base);
  const uint32_t magnitude = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return static_cast<uint16_t>((sign >> 16) | (two_w > 0xFF000000u ? 0x7E00u : magnitude));
}

// Storage formats: T the element, M the math type; pack rounds an M to T (to nearest even), load widens exactly.
struct Bf16Format {
  using T = uint16_t;
  using M = float;
  static float load(uint16_t x) { return bf16_to_float(x); }
  static uint16_t pack(float x) { return float_to_bf16(x); }
};
struct HalfFormat {
  using T = uint16_t;
  using M = float;
  static float load(uint16_t x) { return half_to_float(x); }
  static uint16_t pack(float x) { return float_to_half(x); }
};
template <typename F>
struct PlainFormat {
  using T = F;
  using M = F;
  static F load(F x) { return x; }
  static F pack(F x) { return x; }
};

// The value a torch op of format F stores for the math result x.
template <typename F>
inline typename F::M round_to(typename F::M x) {
  return F::load(F::pack(x));
}

// rms_norm's sum of squares runs 16 lanes (lane l takes elements 16 i + l), sums them in this fixed tree, then adds
// the last dim % 16 squares in order: the scalar and vector paths add the same terms in the same order, so every
// variant of the extension gives the same bits.
constexpr int kNormLanes = 16;

template <typename M>
inline M sum_lanes16(const M* v) {
  M t[8];
  for (int l = 0; l < 8; ++l) t[l] = v[l] + v[l + 8];
  for (int l = 0; l < 4; ++l) t[l] = t[l] + t[l + 4];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// HF's LlamaRMSNorm of one row: h = x / sqrt(mean(x^2) + eps) in M, rounded to the format, times w, rounded.
// 1 / sqrt (two IEEE roundings) is what torch.rsqrt computes on CPU; no approximate reciprocal square root.
template <typename F>
inline typename F::M rms_scale(typename F::M sumsq, int64_t dim, typename F::M eps) {
  using M = typename F::M;
  return M(1) / std::sqrt(sumsq / static_cast<M>(dim) + eps);
}

template <typename F>
void rms_norm_row(const typename F::T* x,  // [D]
                  const typename F::T* w,  // [D]
                  int64_t dim, typename F::M eps,
                  typename F::T* out) {    // [D]
  using M = typename F::M;
  M lanes[kNormLanes] = {};
  int64_t d = 0;
  for (; d + kNormLanes <= dim; d += kNormLanes)
    for (int l = 0; l < kNormLanes; ++l) {
      const M v = F::load(x[d + l]);
      lanes[l] += v * v;
    }
  M sumsq = sum_lanes16(lanes);
  for (; d < dim; ++d) sumsq += F::load(x[d]) * F::load(x[d]);
  const M r = rms_scale<F>(sumsq, dim, eps);
  for (d = 0; d < dim; ++d) out[d] = F::pack(F::load(w[d]) * round_to<F>(F::load(x[d]) * r));
}

// HF's apply_rotary_pos_emb on one row of D = 2 h: out = x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1],
// every product and the sum rounded to the format (-(x2 s) is exactly the rounded (-x2) s).
template <typename F>
inline void rotary_span(const typename F::T* x,  // [D]
                        const typename F::T* c,  // [D] cos
                        const typename F::T* s,  // [D] sin
                        int64_t half, int64_t j0,
                        typename F::T* out) {    // [D], elements j and h + j for j in [j0, h)
  for (int64_t j = j0; j < half; ++j) {
    const auto a = F::load(x[j]), b = F::load(x[half + j]);
    out[j] = F::pack(round_to<F>(a * F::load(c[j])) - round_to<F>(b * F::load(s[j])));
    out[half + j] = F::pack(round_to<F>(b * F::load(c[half + j])) + round_to<F>(a * F::load(s[half + j])));
  }
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__F16C__))
// Vector paths: 16 fp32 lanes (AVX-512F) or 8 (AVX2 + F16C). A lane format widens T to fp32 (load), rounds fp32
// values to T and back (round: bitwise float_to_bf16 / F16C's round to nearest even) and stores rounded values.
#if defined(__AVX512F__)
constexpr int kNormVec = 16;
using NormVec = __m512;
inline NormVec vec_mul(NormVec a, NormVec b) { return _mm512_mul_ps(a, b); }
inline NormVec vec_add(NormVec a, NormVec b) { return _mm512_add_ps(a, b); }
inline NormVec vec_sub(NormVec a, NormVec b) { return _mm512_sub_ps(a, b); }
inline NormVec vec_set1(float x) { return _mm512_set1_ps(x); }
inline void vec_store(float* p, NormVec v) { _mm512_storeu_ps(p, v); }

struct Bf16Lanes {
  static NormVec load(const uint16_t* p) { return widen_bf16x16(p); }
  static NormVec round(NormVec v) {  // float_to_bf16, kept in the upper half of each fp32 lane
    const __m512i u = _mm512_castps_si512(v), hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i up = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x00400000));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_mask_mov_epi32(up, nan, quiet), hi));
  }
  static void store(uint16_t* p, NormVec v) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round(v)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
  }
};
struct HalfLanes {
  static NormVec load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m256i pack(NormVec v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static NormVec round(NormVec v) { return _mm512_cvtph_ps(pack(v)); }
  static void store(uint16_t* p, NormVec v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), pack(v)); }
};
struct FloatLanes {
  static NormVec load(const float* p) { return _mm512_loadu_ps(p); }
  static NormVec round(NormVec v) { return v; }
  static void store(float* p, NormVec v) { _mm512_storeu_ps(p, v); }
};
#else
constexpr int kNormVec = 8;
using NormVec = __m256;
inline NormVec vec_mul(NormVec a, NormVec b) { return _mm256_mul_ps(a, b); }
inline NormVec vec_add(NormVec a, NormVec b) { return _mm256_add_ps(a, b); }
inline NormVec vec_sub(NormVec a, NormVec b) { return _mm256_sub_ps(a, b); }
inline NormVec vec_set1(float x) { return _mm256_set1_ps(x); }
inline void vec_store(float* p, NormVec v) { _mm256_storeu_ps(p, v); }

struct Bf16Lanes {
  static NormVec load(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static NormVec round(NormVec v) {  // float_to_bf16, kept in the upper half of each fp32 lane
    const __m256i u = _mm256_castps_si256(v), hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i up = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_blendv_epi8(up, quiet, nan), hi));
  }
  static void store(uint16_t* p, NormVec v) {
    const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(round(v)), 16);  // < 2^16: packus keeps them
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};
struct HalfLanes {
  static NormVec load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m128i pack(NormVec v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static NormVec round(NormVec v) { return _mm256_cvtph_ps(pack(v)); }
  static void store(uint16_t* p, NormVec v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), pack(v)); }
};
struct FloatLanes {
  static NormVec load(const float* p) { return _mm256_loadu_ps(p); }
  static NormVec round(NormVec v) { return v; }
  static void store(float* p, NormVec v) { _mm256_storeu_ps(p, v); }
};
#endif

// rms_norm_row with the squares and the output in vectors: the same lanes and order (16 / kNormVec vectors per
// 16 elements), the same scalar tree and tail, so the same bits.
template <typename F, typename V>
void rms_norm_row_vec(const typename F::T* x, const typename F::T* w, int64_t dim, float eps, typename F::T* out) {
  constexpr int kParts = kNormLanes / kNormVec;
  NormVec acc[kParts];
  for (int p = 0; p < kParts; ++p) acc[p] = vec_set1(0.0f);
  int64_t d = 0;
  for (; d + kNormLanes <= dim; d += kNormLanes)
    for (int p = 0; p < kParts; ++p) {
      const NormVec v = V::load(x + d + p * kNormVec);
      acc[p] = vec_add(acc[p], vec_mul(v, v));
    }
  float lanes[kNormLanes];
  for (int p = 0; p < kParts; ++p) vec_store(lanes + p * kNormVec, acc[p]);
  float sumsq = sum_lanes16(lanes);
  for (; d < dim; ++d) sumsq += F::load(x[d]) * F::load(x[d]);
  const float r = rms_scale<F>(sumsq, dim, eps);
  const NormVec rv = vec_set1(r);
  for (d = 0; d + kNormVec <= dim; d += kNormVec)
    V::store(out + d, vec_mul(V::load(w + d), V::round(vec_mul(V::load(x + d), rv))));
  for (; d < dim; ++d) out[d] = F::pack(F::load(w[d]) * round_to<F>(F::load(x[d]) * r));
}

template <typename F, typename V>
void rotary_row_vec(const typename F::T* x, const typename F::T* c, const typename F::T* s, int64_t half,
                    typename F::T* out) {
  int64_t j = 0;
  for (; j + kNormVec <= half; j += kNormVec) {
    const NormVec a = V::load(x + j), b = V::load(x + half + j);
    V::store(out + j, vec_sub(V::round(vec_mul(a, V::load(c + j))), V::round(vec_mul(b, V::load(s + j)))));
    V::store(out + half + j,
             vec_add(V::round(vec_mul(b, V::load(c + half + j))), V::round(vec_mul(a, V::load(s + half + j)))));
  }
  rotary_span<F>(x, c, s, half, j, out);
}
#define SPECDEC_NORM_VEC 1
#endif

// The row kernels by format: the vector path where this build has one (fp64, and builds without AVX2 + F16C, run
// the scalar loops).
#if defined(SPECDEC_NORM_VEC)
template <typename F>
struct VecLanes {
  using type = void;
};
template <>
struct VecLanes<Bf16Format> {
  using type = Bf16Lanes;
};
template <>
struct VecLanes<HalfFormat> {
  using type = HalfLanes;
};
template <>
struct VecLanes<PlainFormat<float>> {
  using type = FloatLanes;
};
#endif

template <typename F>
inline void rms_norm_one(const typename F::T* x, const typename F::T* w, int64_t dim, typename F::M eps,
                         typename F::T* out) {
#if defined(SPECDEC_NORM_VEC)
  using V = typename VecLanes<F>::type;
  if constexpr (!std::is_void_v<V>) {
    rms_norm_row_vec<F, V>(x, w, dim, eps, out);
    return;
  }
#endif
  rms_norm_row<F>(x, w, dim, eps, out);
}

template <typename F>
inline void rotary_one(const typename F::T* x, const typename F::T* c, const typename F::T* s, int64_t half,
                       typename F::T* out) {
#if defined(SPECDEC_NORM_VEC)
  using V = typename VecLanes<F>::type;
  if constexpr (!std::is_void_v<V>) {
    rotary_row_vec<F, V>(x, c, s, half, out);
    return;
  }
#endif
  rotary_span<F>(x, c, s, half, 0, out);
}

}  // namespace specdec
