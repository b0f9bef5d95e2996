// Skinny linear y = x W^T for a few rows of x (a draft model's decode step): raw pointers + sizes.
// A decode step is bound by reading W once from memory; BLAS GEMM paths tuned for large batches reach a
// fraction of the copy bandwidth on 1-16 rows. Each call computes a block of output features for every row,
// so a block of W is read from memory once and reused from L1 across the rows.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define SPECDEC_LINEAR_AVX512BF16 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECDEC_LINEAR_AVX2 1
#endif

#include "specdec/common.h"

namespace specdec {

constexpr int64_t kLinearBlock = 4;  // output features per block
constexpr int kLinearLanes = 16;     // independent partial sums (vectorise without reassociating a sum)

inline float bf16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

// Round to nearest even, like torch's float -> bfloat16 (NaN stays a quiet NaN).
inline uint16_t float_to_bf16(float f) {
  uint32_t u = bits_of(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// y[r, o] = sum_i x[r, i] * w[o, i] for o in [o_begin, o_end), r in [0, n); float/double, accumulated in T.
template <typename T>
void skinny_linear_block(const T* x, const T* w, int64_t n, int64_t in, int64_t out, int64_t o_begin,
                         int64_t o_end, T* y) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const T* wr = w + o * in;
    for (int64_t r = 0; r < n; ++r) {
      const T* xr = x + r * in;
      T acc[kLinearLanes] = {};
      int64_t i = 0;
      for (; i + kLinearLanes <= in; i += kLinearLanes)
        for (int j = 0; j < kLinearLanes; ++j) acc[j] += xr[i + j] * wr[i + j];
      T s = 0;
      for (int j = 0; j < kLinearLanes; ++j) s += acc[j];
      for (; i < in; ++i) s += xr[i] * wr[i];
      y[r * out + o] = s;
    }
  }
}

// The same for bfloat16 bits (x, w, y), fp32 accumulation, widened lane by lane: the path of CPUs without AVX2
// (the vector paths follow).
inline void skinny_linear_block_bf16(const uint16_t* x, const uint16_t* w, int64_t n, int64_t in, int64_t out,
                                     int64_t o_begin, int64_t o_end, uint16_t* y) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint16_t* wr = w + o * in;
    for (int64_t r = 0; r < n; ++r) {
      const uint16_t* xr = x + r * in;
      float acc[kLinearLanes] = {};
      int64_t k = 0;
      for (; k + kLinearLanes <= in; k += kLinearLanes)
        for (int l = 0; l < kLinearLanes; ++l) acc[l] += bf16_to_float(xr[k + l]) * bf16_to_float(wr[k + l]);
      float s = 0;
      for (int l = 0; l < kLinearLanes; ++l) s += acc[l];
      for (; k < in; ++k) s += bf16_to_float(xr[k]) * bf16_to_float(wr[k]);
      y[r * out + o] = float_to_bf16(s);
    }
  }
}

// Output features per block of the bf16 paths (the unit the adapter's OpenMP loop hands out).
#if defined(SPECDEC_LINEAR_AVX512BF16)
constexpr int64_t kLinearBlockBf16 = 16;
#else
constexpr int64_t kLinearBlockBf16 = kLinearBlock;
#endif

#if defined(SPECDEC_LINEAR_AVX512BF16)
// AVX512-BF16: 32 products per instruction (VDPBF16PS: pairs of bf16 products summed into 16 fp32 lanes). A tile
// is R rows of x against O rows of W: each 32-element chunk of a W row is loaded once and feeds R rows' dot
// products (R * O independent accumulators), so a verification pass of a few rows costs about what one row does
// (the weights' trip from memory). A row's 16 lanes are summed in the tree of _mm512_reduce_add_ps (lanes k and
// k + 8, then k and k + 4, k and k + 2, k and k + 1), O accumulators at a time; every tile runs the same chunks
// in the same order per (row, output), so row r of a call equals a call on row r alone.

// W is prefetched into L2 kPrefetchBytesL2 ahead of each row a tile reads: with the hardware prefetcher alone, or
// prefetches into L1 (whose few fill buffers cap the misses in flight), the stream falls well short of memory speed
// once each chunk feeds several rows' products.
constexpr int kPrefetchBytesL2 = 16384;  // a prefetch never faults, so running past the end of W is harmless

inline __m512 sum_halves(__m512 a, __m512 b) {  // [a[k + 8] + a[k], b[k + 8] + b[k]], k < 8
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
}

inline __m512 sum_quarters(__m512 ab, __m512 cd) {  // 128-bit lane j: the 4 sums (k + 4) + k of a, b, c, d's halves
  return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)),
                       _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)));
}

// Lane j = the sum of accumulator j's 16 lanes, j < 4 (the accumulators by value: an array passed by address makes
// GCC store the tile's accumulators to the stack on every step of its loop).
inline __m128 sum_lanes_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 v = sum_quarters(sum_halves(a0, a1), sum_halves(a2, a3));
  __m512 t = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));  // lanes 4j, 4j + 1: k + (k + 2)
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));        // lane 4j: lane + (lane + 1)
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, t));
}

// The same for 8 accumulators.
inline __m256 sum_lanes_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                               __m512 a7) {
  const __m512d v = _mm512_castps_pd(sum_quarters(sum_halves(a0, a1), sum_halves(a2, a3)));
  const __m512d u = _mm512_castps_pd(sum_quarters(sum_halves(a4, a5), sum_halves(a6, a7)));
  // 128-bit lane j: accumulator j's sums k + (k + 2), k < 2, then accumulator j + 4's
  __m512 t = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(v, u)), _mm512_castpd_ps(_mm512_unpackhi_pd(v, u)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));  // even lanes: lane + (lane + 1)
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, t));
}

// float_to_bf16 on 8 lanes, bit for bit (round to nearest even, NaN a quiet NaN).
inline __m128i float_to_bf16x8(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
  const __mmask8 nan = _mm256_cmpgt_epi32_mask(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                               _mm256_set1_epi32(0x7F800000));
  return _mm256_cvtepi32_epi16(_mm256_mask_blend_epi32(nan, rounded, quiet));
}

// Rows [r0, r0 + R) of x against W rows [o0, o0 + m), m <= O (padding columns repeat row o0 and are dropped);
// Prefetch: ask for W kPrefetchBytesL2 ahead (the first row group of a tile; later groups find it in L1).
template <int R, int O, bool Prefetch>
inline void skinny_tile_bf16_avx512(const uint16_t* x, const uint16_t* w, int64_t in, int64_t out, int64_t r0,
                                    int64_t o0, int64_t m, uint16_t* y) {
  const int64_t in32 = in / 32 * 32;
  const uint16_t* wr[O];
  for (int j = 0; j < O; ++j) wr[j] = w + (o0 + (j < m ? j : 0)) * in;
  // a[R][O] stays in registers only if every index is a constant: the loops over q and j are unrolled, and the
  // accumulators are summed before any loop that runs to m
  __m512 a[R][O];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) a[q][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < in32; i += 32) {
    __m512bh u[O];
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) u[j] = (__m512bh)_mm512_loadu_si512(wr[j] + i);
    if constexpr (Prefetch)  // one 64-byte line per row; W's rows are contiguous, so this runs into later tiles'
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(wr[j] + i) + kPrefetchBytesL2, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      const __m512bh v = (__m512bh)_mm512_loadu_si512(x + (r0 + q) * in + i);
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j) a[q][j] = _mm512_dpbf16_ps(a[q][j], u[j], v);
    }
  }
  float s[R][O];
  const bool whole = in32 == in && m == O;  // no tail, no padding: O outputs per row stored at once
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q) {
    uint16_t* yr = y + (r0 + q) * out + o0;
    if constexpr (O == 4) {
      const __m128 v = sum_lanes_avx512(a[q][0], a[q][1], a[q][2], a[q][3]);
      if (whole)
        _mm_storel_epi64(reinterpret_cast<__m128i*>(yr), float_to_bf16x8(_mm256_castps128_ps256(v)));
      else
        _mm_storeu_ps(s[q], v);
    } else {
      const __m256 v = sum_lanes_avx512(a[q][0], a[q][1], a[q][2], a[q][3], a[q][4], a[q][5], a[q][6], a[q][7]);
      if (whole)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yr), float_to_bf16x8(v));
      else
        _mm256_storeu_ps(s[q], v);
    }
  }
  if (whole) return;
  for (int q = 0; q < R; ++q) {
    const uint16_t* xr = x + (r0 + q) * in;
    for (int j = 0; j < m; ++j) {
      for (int64_t k = in32; k < in; ++k) s[q][j] += bf16_to_float(xr[k]) * bf16_to_float(wr[j][k]);
      y[(r0 + q) * out + o0 + j] = float_to_bf16(s[q][j]);
    }
  }
}

// One or two rows (an AR step, a draft step): 8 W rows per tile (8 or 16 independent accumulators); three rows and
// more (verification passes): 4 W rows x up to 6 rows of x (up to 24 accumulators and 4 chunks of W in the 32 zmm
// registers), so each chunk of W feeds up to 24 products; more than 6 rows go 4 at a time until at most 6 are
// left, the later groups reading the tile's W rows from L1.
inline void skinny_linear_block_bf16_avx512(const uint16_t* x, const uint16_t* w, int64_t n, int64_t in,
                                            int64_t out, int64_t o_begin, int64_t o_end, uint16_t* y) {
  if (n <= 2) {
    for (int64_t o0 = o_begin; o0 < o_end; o0 += 8) {
      const int64_t m = (o_end - o0) < 8 ? (o_end - o0) : 8;
      if (n == 2) skinny_tile_bf16_avx512<2, 8, true>(x, w, in, out, 0, o0, m, y);
      if (n == 1) skinny_tile_bf16_avx512<1, 8, true>(x, w, in, out, 0, o0, m, y);
    }
    return;
  }
  for (int64_t o0 = o_begin; o0 < o_end; o0 += 4) {
    const int64_t m = (o_end - o0) < 4 ? (o_end - o0) : 4;
    int64_t r0 = 0;
    if (n > 6) skinny_tile_bf16_avx512<4, 4, true>(x, w, in, out, 0, o0, m, y), r0 = 4;
    for (; n - r0 > 6; r0 += 4) skinny_tile_bf16_avx512<4, 4, false>(x, w, in, out, r0, o0, m, y);
    if (r0 == 0) {
      switch (n) {  // 3 to 6 rows
        case 6: skinny_tile_bf16_avx512<6, 4, true>(x, w, in, out, 0, o0, m, y); break;
        case 5: skinny_tile_bf16_avx512<5, 4, true>(x, w, in, out, 0, o0, m, y); break;
        case 4: skinny_tile_bf16_avx512<4, 4, true>(x, w, in, out, 0, o0, m, y); break;
        default: skinny_tile_bf16_avx512<3, 4, true>(x, w, in, out, 0, o0, m, y);
      }
      continue;
    }
    switch (n - r0) {  // 3 to 6 rows left
      case 6: skinny_tile_bf16_avx512<6, 4, false>(x, w, in, out, r0, o0, m, y); break;
      case 5: skinny_tile_bf16_avx512<5, 4, false>(x, w, in, out, r0, o0, m, y); break;
      case 4: skinny_tile_bf16_avx512<4, 4, false>(x, w, in, out, r0, o0, m, y); break;
      default: skinny_tile_bf16_avx512<3, 4, false>(x, w, in, out, r0, o0, m, y);
    }
  }
}
#endif

#if defined(SPECDEC_LINEAR_AVX2)
// AVX2 + FMA, no bf16 dot-product instruction (the bf16 loop above would widen every weight once per row): x comes
// widened to fp32 once per call (xf [n, in]); each 8-wide chunk of two W rows is widened in registers and used for
// up to four rows of x, so a verification pass of up to four rows costs what one row does (the weights' trip from
// memory). Every row's sum runs the same lanes in the same order whichever rows share its call, so row r of a call
// equals a call on row r alone. The weights are prefetched kPrefetchBytes ahead: once each chunk feeds several rows'
// FMAs, the hardware prefetcher alone no longer keeps the stream at memory speed (a 4-row pass of SmolLM2's
// linears took 1.45x a 1-row one without it, 1.15x with it, on a 2-core AVX2 EPYC).
constexpr int kPrefetchBytes = 4096;  // a prefetch never faults, so running past the end of W is harmless

inline __m256 widen_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Rows [r0, r0 + R) of x against W rows [o0, o0 + m), m <= O (padding columns repeat row o0 and are dropped).
template <int R, int O>
inline void skinny_tile_bf16_avx2(const float* xf, const uint16_t* w, int64_t in, int64_t out, int64_t r0,
                                  int64_t o0, int64_t m, uint16_t* y) {
  const int64_t in8 = in / 8 * 8;
  const uint16_t* wr[O];
  for (int j = 0; j < O; ++j) wr[j] = w + (o0 + (j < m ? j : 0)) * in;
  __m256 a[R][O];
  for (int q = 0; q < R; ++q)
    for (int j = 0; j < O; ++j) a[q][j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < in8; i += 8) {
    __m256 u[O];
    for (int j = 0; j < O; ++j) u[j] = widen_bf16x8(wr[j] + i);
    if ((i & 31) == 0)  // one prefetch per 64-byte line; W's rows are contiguous, so this runs into later tiles' rows
      for (int j = 0; j < O; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + i) + kPrefetchBytes, _MM_HINT_T0);
    for (int q = 0; q < R; ++q) {
      const __m256 v = _mm256_loadu_ps(xf + (r0 + q) * in + i);
      for (int j = 0; j < O; ++j) a[q][j] = _mm256_fmadd_ps(u[j], v, a[q][j]);
    }
  }
  for (int q = 0; q < R; ++q) {
    const float* xr = xf + (r0 + q) * in;
    for (int j = 0; j < m; ++j) {
      float s = sum_lanes(a[q][j]);
      for (int64_t k = in8; k < in; ++k) s += xr[k] * bf16_to_float(wr[j][k]);
      y[(r0 + q) * out + o0 + j] = float_to_bf16(s);
    }
  }
}

// One or two rows (an AR step, a draft step): 4 W rows per tile, the widening amortised over few FMAs but the
// loop lean; three rows and more (verification passes): 2 W rows x up to 6 rows of x (12 accumulators, 16 ymm
// registers), so each widened chunk feeds up to 12 FMAs; more than 6 rows go 4 at a time until at most 6 are left.
// Every tiling adds the same products in the same order per (row, output), so the results are bitwise equal.
inline void skinny_linear_block_bf16_avx2(const float* xf, const uint16_t* w, int64_t n, int64_t in, int64_t out,
                                          int64_t o_begin, int64_t o_end, uint16_t* y) {
  if (n <= 2) {
    for (int64_t o0 = o_begin; o0 < o_end; o0 += 4) {
      const int64_t m = (o_end - o0) < 4 ? (o_end - o0) : 4;
      if (n == 2) skinny_tile_bf16_avx2<2, 4>(xf, w, in, out, 0, o0, m, y);
      if (n == 1) skinny_tile_bf16_avx2<1, 4>(xf, w, in, out, 0, o0, m, y);
    }
    return;
  }
  for (int64_t o0 = o_begin; o0 < o_end; o0 += 2) {
    const int64_t m = (o_end - o0) < 2 ? (o_end - o0) : 2;
    int64_t r0 = 0;
    for (; n - r0 > 6; r0 += 4) skinny_tile_bf16_avx2<4, 2>(xf, w, in, out, r0, o0, m, y);
    switch (n - r0) {  // 3 to 6 rows left
      case 6: skinny_tile_bf16_avx2<6, 2>(xf, w, in, out, r0, o0, m, y); break;
      case 5: skinny_tile_bf16_avx2<5, 2>(xf, w, in, out, r0, o0, m, y); break;
      case 4: skinny_tile_bf16_avx2<4, 2>(xf, w, in, out, r0, o0, m, y); break;
      default: skinny_tile_bf16_avx2<3, 2>(xf, w, in, out, r0, o0, m, y);
    }
  }
}
#endif

}  // namespace specdec
