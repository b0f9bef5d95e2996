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

// The vector exponentials of the softmax (exp_nonpos_ps512, exp_nonpos_ps): e^x for x <= 0 as 2^k e^r with
// k = round(x log2 e) and r = x - k ln 2, ln 2 taken in two parts (the first with few enough bits that k times it is
// exact), e^r by a degree-6 Taylor polynomial (|r| <= ln2 / 2, relative error ~2e-7), 2^k built in the exponent bits;
// 0 below kExpFloor (where e^x underflows), NaN stays NaN.
constexpr float kExpFloor = -87.3f;
constexpr float kLog2e = 1.44269504f;
constexpr float kLn2Hi = 0.693359375f;     // ln 2 to 11 significant bits
constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi
constexpr float kExpTaylor[7] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};  // r^6 first

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bf16 rows with D a multiple of 32, at most kAttentionMaxDim512: 16 cache slots at a time. Each slot's dot product
// runs VDPBF16PS over D (32 products per instruction) into its own accumulator, the 16 accumulators are summed in
// one transposing tree (sum_lanes_avx512) into a vector of 16 scores, the exponentials are vectorised, and v's
// weighted sum (slot by slot) is kept in fp32 vectors of 16 and divided by the total (the nonzero weights packed in
// slot order) at the end; ``scores`` holds 2 x s_len rounded up to 16 (scores, then the packed weights). A partial
// last group reads no slot past the cache (its missing slots score -inf, weight 0). The rows of one KV head share
// each slot's widened v in the weighted sum (decode_attention_values_bf16). Same math as decode_attention_row,
// another summation order; every row adds its own terms in the same order whatever rows share the call, so a row's
// result does not depend on the other rows, nor on where blocked slots fall between its visible ones.
constexpr int64_t kAttentionMaxDim512 = 256;

// e^x for x <= 0 on 16 lanes (see kExpTaylor).
inline __m512 exp_nonpos_ps512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(kExpFloor);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  const __m512 xc = _mm512_max_ps(x, lo);
  const __m512 k =
      _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-kLn2Hi), xc);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(-kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpTaylor[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  const __m512 y = _mm512_mask_mov_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e)), under, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(y, nan, x);
}

// The dot products q.k_s of one query row, s < s_len, into ``dots`` (s_len rounded up to 16; a partial last group's
// missing slots get 0 and are never read as weights).
inline void decode_attention_dots_bf16(const uint16_t* q, const uint16_t* k, int64_t s_len, int64_t dim,
                                       float* dots) {
  const int64_t chunks = dim / 32;
  __m512bh qc[kAttentionMaxDim512 / 32];
  for (int64_t c = 0; c < chunks; ++c) qc[c] = (__m512bh)_mm512_loadu_si512(q + 32 * c);
  for (int64_t s0 = 0; s0 < s_len; s0 += 16) {
    const int live = s_len - s0 < 16 ? static_cast<int>(s_len - s0) : 16;
    __m512 a[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      a[j] = _mm512_setzero_ps();
      if (j < live) {
        const uint16_t* ks = k + (s0 + j) * dim;
        for (int64_t c = 0; c < chunks; ++c)
          a[j] = _mm512_dpbf16_ps(a[j], qc[c], (__m512bh)_mm512_loadu_si512(ks + 32 * c));
      }
    }
    _mm512_storeu_ps(dots + s0,
                     _mm512_insertf32x8(
                         _mm512_castps256_ps512(sum_lanes_avx512(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])),
                         sum_lanes_avx512(a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]), 1));
  }
}

// The softmax weights of one query row from its dot products: ``scores`` [s_len] holds q.k_s on entry and gets
// e^(x - max) per slot (x = scale q.k_s + mask), and the return value is 1 / their total. ``scores`` holds 2 x s_len
// rounded up to 16 (the weights, then the nonzero ones packed for the total).
inline float decode_attention_softmax_bf16(const float* mask, int64_t s_len, float scale, float* scores) {
  const float inf = std::numeric_limits<float>::infinity();
  __m512 top = _mm512_set1_ps(-inf);
  for (int64_t s0 = 0; s0 < s_len; s0 += 16) {
    const int live = s_len - s0 < 16 ? static_cast<int>(s_len - s0) : 16;
    const __mmask16 in = static_cast<__mmask16>((1u << live) - 1u);
    const __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(scores + s0), _mm512_set1_ps(scale),
                                     _mm512_mask_loadu_ps(_mm512_set1_ps(-inf), in, mask + s0));
    _mm512_storeu_ps(scores + s0, x);  // scores holds s_len rounded up to 16
    top = _mm512_max_ps(top, x);
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  for (int64_t s0 = 0; s0 < s_len; s0 += 16)  // all -inf: NaN, as softmax
    _mm512_storeu_ps(scores + s0, exp_nonpos_ps512(_mm512_sub_ps(_mm512_loadu_ps(scores + s0), m)));
  // The total over the nonzero weights packed in slot order, then summed in 16 lanes by packed index: blocked slots
  // (weight 0) drop out, so a tree node's total equals that of a one-token step over the same visible keys wherever
  // the blocked slots fall (lanes indexed by cache slot would group the terms by their position in the cache, which
  // differs between a tree pass and a chain of one-token steps). NaN weights are kept. The packing compresses into a
  // register and stores all 16 lanes: a compress straight to memory is microcoded on Zen 4, slow enough there to
  // cost more than the rest of the softmax. The lanes past the kept ones land where a later group writes or the
  // total does not read (np <= s0, so every store ends within the padded copy).
  const int64_t padded = (s_len + 15) / 16 * 16;
  float* packed = scores + padded;
  int64_t np = 0;
  for (int64_t s0 = 0; s0 < s_len; s0 += 16) {
    const __m512 e = _mm512_loadu_ps(scores + s0);
    const __mmask16 keep = _mm512_cmp_ps_mask(e, _mm512_setzero_ps(), _CMP_NEQ_UQ);
    _mm512_storeu_ps(packed + np, _mm512_maskz_compress_ps(keep, e));
    np += _mm_popcnt_u32(keep);
  }
  __m512 lanes = _mm512_setzero_ps();
  for (int64_t i = 0; i < np; i += 16) {
    const __mmask16 in = np - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (np - i)) - 1u);
    lanes = _mm512_add_ps(lanes, _mm512_maskz_loadu_ps(in, packed + i));
  }
  return 1.0f / _mm512_reduce_add_ps(lanes);
}

#if defined(SPECDEC_LINEAR_AMX)
// The dot products of ``rows`` query rows (q's rows, dim apart, at most kAmxRows) with every slot, by AMX tiles as in
// skinny_linear's AMX path: 16 slots straight from k's rows are the left operand, the query rows packed once as pairs
// the right one, so a row's dots do not depend on the other rows; VDPBF16PS, one row at a time, is the slow part of
// a tree pass's attention on CPUs with AMX. Row j's dots go to dots + j * stride (s_len rounded up to 16; slots past
// s_len get 0). The calling thread's tiles must be configured for ``rows`` rows (amx_configure); qp: scratch of
// dim / 2 * rows pairs, pad: of 16 * dim values (a last tile of fewer than 16 slots).
inline void decode_attention_dots_amx(const uint16_t* q, const uint16_t* k, int64_t s_len, int64_t dim, int rows,
                                      uint32_t* qp, uint16_t* pad, float* dots, int64_t stride) {
  amx_pack_rows(q, dim, dim, 0, rows, qp);
  alignas(64) float c[4 * 256];
  for (int64_t s0 = 0; s0 < s_len; s0 += kAmxBlock) {
    const int nb = amx_block_tiles(qp, k + s0 * dim, s_len - s0 < kAmxBlock ? s_len - s0 : kAmxBlock, dim, dim, rows,
                                   pad, c);
    for (int j = 0; j < nb; ++j)
      for (int r = 0; r < rows; ++r) _mm512_storeu_ps(dots + r * stride + s0 + 16 * j, amx_tile_row(c, j, r));
  }
}
#endif

// fp32 accumulators of the weighted sums of v that one call keeps (rows x D / 16 of them, in registers)
constexpr int kAttentionSumRegs512 = 24;

// Rows at most decode_attention_values_bf16 takes per call for a head width of ``dim``.
constexpr int decode_attention_row_block_bf16(int64_t dim) {
  return kAttentionSumRegs512 / (dim / 16) > 0 ? static_cast<int>(kAttentionSumRegs512 / (dim / 16)) : 1;
}

// out[j] = inv[j] * sum_s w[j][s] v[s] for ``rows`` query rows of one KV head (rows x D / 16 <= kAttentionSumRegs512),
// ``w`` row j at w + j * w_stride. Each slot's v is widened once for all the rows; every row adds its terms in slot
// order, one fused multiply-add per 16 lanes, exactly as it would alone, so a row's bits do not depend on the others.
template <int Blocks>
inline void decode_attention_values_bf16(const uint16_t* v, int64_t s_len, const float* w, int64_t w_stride,
                                         const float* inv, int rows, uint16_t* out) {
  constexpr int64_t dim = 16 * Blocks;
  constexpr int kRows = decode_attention_row_block_bf16(dim);
  __m512 sum[kRows][Blocks];
#pragma GCC unroll 24
  for (int j = 0; j < kRows; ++j)
    for (int b = 0; b < Blocks; ++b) sum[j][b] = _mm512_setzero_ps();
  for (int64_t s = 0; s < s_len; ++s) {
    __m512 vs[Blocks];
#pragma GCC unroll 16
    for (int b = 0; b < Blocks; ++b) vs[b] = widen_bf16x16(v + s * dim + 16 * b);
#pragma GCC unroll 24
    for (int j = 0; j < kRows; ++j) {
      if (j < rows) {
        const __m512 ws = _mm512_set1_ps(w[j * w_stride + s]);
        for (int b = 0; b < Blocks; ++b) sum[j][b] = _mm512_fmadd_ps(ws, vs[b], sum[j][b]);
      }
    }
  }
  for (int j = 0; j < rows; ++j) {
    const __m512 iv = _mm512_set1_ps(inv[j]);
    uint16_t* o = out + j * dim;
    for (int b = 0; b < Blocks; ++b) {
      const __m512 x = _mm512_mul_ps(sum[j][b], iv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * b), float_to_bf16x8(_mm512_castps512_ps256(x)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * b + 8), float_to_bf16x8(_mm512_extractf32x8_ps(x, 1)));
    }
  }
}

// decode_attention_values_bf16 for a runtime D (a multiple of 32, at most kAttentionMaxDim512).
inline void decode_attention_values_bf16_any(const uint16_t* v, int64_t s_len, int64_t dim, const float* w,
                                             int64_t w_stride, const float* inv, int rows, uint16_t* out) {
  switch (dim / 16) {
    case 2: return decode_attention_values_bf16<2>(v, s_len, w, w_stride, inv, rows, out);
    case 4: return decode_attention_values_bf16<4>(v, s_len, w, w_stride, inv, rows, out);
    case 6: return decode_attention_values_bf16<6>(v, s_len, w, w_stride, inv, rows, out);
    case 8: return decode_attention_values_bf16<8>(v, s_len, w, w_stride, inv, rows, out);
    case 10: return decode_attention_values_bf16<10>(v, s_len, w, w_stride, inv, rows, out);
    case 12: return decode_attention_values_bf16<12>(v, s_len, w, w_stride, inv, rows, out);
    case 14: return decode_attention_values_bf16<14>(v, s_len, w, w_stride, inv, rows, out);
    default: return decode_attention_values_bf16<16>(v, s_len, w, w_stride, inv, rows, out);
  }
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// AVX2 + FMA, bf16 rows with D a multiple of 16 and at most 128: the path of CPUs without bf16 dot products, and of
// the AVX512-BF16 builds for the head widths their path does not take (D not a multiple of 32, e.g. 16, 48 or 80),
// which would otherwise run the scalar loop. Each 16 bf16 values are loaded as 8 32-bit words and split into their
// even and odd halves with a shift and a mask (no cross-lane widening), q is split the same way once, the weighted
// sum of v is kept split and interleaved back at the end; dot products
// run four cache slots at a time (two FMA chains per slot, one horizontal reduction for the four); exp is
// vectorised. About 7 ns per slot on a 2-core AVX2 EPYC, where the generic loop's scalar reductions took ~30-50.
// Same math as decode_attention_row, another summation order, the weighted sum divided by the total at the end, and
// an exp within a few ulp of std::exp (0 below -87.3, NaN stays NaN). Every query row is computed alone, so a row's
// result does not depend on the other rows of the call.
constexpr int64_t kAttentionMaxDimAvx2 = 128;

inline __m128 sum_lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {  // [sum a0, sum a1, sum a2, sum a3]
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// e^x for x <= 0 on 8 lanes (see kExpTaylor).
inline __m256 exp_nonpos_ps(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExpFloor);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  const __m256 xc = _mm256_max_ps(x, lo);
  const __m256 k =
      _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(k, _mm256_set1_ps(-kLn2Hi), xc);
  r = _mm256_fmadd_ps(k, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpTaylor[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpTaylor[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
  return _mm256_blendv_ps(y, x, nan);
}

inline void split_bf16x16(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline void decode_attention_row_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const float* mask,
                                      int64_t s_len, int64_t dim, float scale, float* scores, float* acc,
                                      uint16_t* out) {
  const int64_t blocks = dim / 16;
  __m256 qe[kAttentionMaxDimAvx2 / 16], qo[kAttentionMaxDimAvx2 / 16];
  for (int64_t c = 0; c < blocks; ++c) split_bf16x16(q + 16 * c, qe[c], qo[c]);
  const auto dot = [&](const uint16_t* ks, __m256 a) {  // two FMA chains per slot (even, odd halves)
    __m256 b = _mm256_setzero_ps();
    for (int64_t c = 0; c < blocks; ++c) {
      __m256 ke, ko;
      split_bf16x16(ks + 16 * c, ke, ko);
      a = _mm256_fmadd_ps(qe[c], ke, a);
      b = _mm256_fmadd_ps(qo[c], ko, b);
    }
    return _mm256_add_ps(a, b);
  };
  float top = -std::numeric_limits<float>::infinity();
  int64_t s = 0;
  for (; s + 4 <= s_len; s += 4) {
    const uint16_t* ks = k + s * dim;
    const __m256 z = _mm256_setzero_ps();
    float dots[4];
    _mm_storeu_ps(dots, sum_lanes4(dot(ks, z), dot(ks + dim, z), dot(ks + 2 * dim, z), dot(ks + 3 * dim, z)));
    for (int j = 0; j < 4; ++j) {
      const float x = dots[j] * scale + mask[s + j];
      scores[s + j] = x;
      top = x > top ? x : top;
    }
  }
  for (; s < s_len; ++s) {  // the same reduction tree as the groups of four: a slot's score ignores its position
    const __m256 z = _mm256_setzero_ps();
    const float x = _mm_cvtss_f32(sum_lanes4(dot(k + s * dim, z), z, z, z)) * scale + mask[s];
    scores[s] = x;
    top = x > top ? x : top;
  }
  // a row masked everywhere with -inf: top = -inf, x - top = NaN, so the row is NaN, as softmax gives
  const __m256 tv = _mm256_set1_ps(top);
  for (s = 0; s + 8 <= s_len; s += 8)
    _mm256_storeu_ps(scores + s, exp_nonpos_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + s), tv)));
  if (s < s_len) {  // the last 1-7 slots: one padded vector, each lane computed as in the loop above
    float e[8] = {};
    for (int64_t j = s; j < s_len; ++j) e[j - s] = scores[j] - top;
    _mm256_storeu_ps(e, exp_nonpos_ps(_mm256_loadu_ps(e)));
    for (int64_t j = s; j < s_len; ++j) scores[j] = e[j - s];
  }
  // Unnormalised weighted sum and the softmax total in one pass over the slots, both in slot order: a blocked slot
  // (weight exactly 0) then adds exact zeros wherever it sits, so a query row gives the bits it gives over a cache
  // without that slot (a tree node in a verification pass = the same token in a one-token step).
  __m256 se[kAttentionMaxDimAvx2 / 16], so[kAttentionMaxDimAvx2 / 16];
  for (int64_t c = 0; c < blocks; ++c) se[c] = so[c] = _mm256_setzero_ps();
  float total = 0;
  for (s = 0; s < s_len; ++s) {
    total += scores[s];
    const __m256 p = _mm256_set1_ps(scores[s]);
    for (int64_t c = 0; c < blocks; ++c) {
      __m256 ve, vo;
      split_bf16x16(v + s * dim + 16 * c, ve, vo);
      se[c] = _mm256_fmadd_ps(p, ve, se[c]);
      so[c] = _mm256_fmadd_ps(p, vo, so[c]);
    }
  }
  const __m256 tw = _mm256_set1_ps(total);
  for (int64_t c = 0; c < blocks; ++c) {  // interleave the even and odd halves back: acc[16c + 2i (+1)]
    const __m256 lo = _mm256_unpacklo_ps(se[c], so[c]), hi = _mm256_unpackhi_ps(se[c], so[c]);
    _mm256_storeu_ps(acc + 16 * c, _mm256_div_ps(_mm256_permute2f128_ps(lo, hi, 0x20), tw));
    _mm256_storeu_ps(acc + 16 * c + 8, _mm256_div_ps(_mm256_permute2f128_ps(lo, hi, 0x31), tw));
  }
  for (int64_t d = 0; d < dim; ++d) out[d] = float_to_bf16(acc[d]);
}
#endif

}  // namespace specdec
