// Skinny linear y = x W^T for a few rows of x (a draft model's decode step): raw pointers + sizes.
// A decode step is bound by reading W once from memory; BLAS GEMM paths tuned for large batches reach a
// fraction of the copy bandwidth on 1-16 rows. Each call computes a block of output features for every row,
// so a block of W is read from memory once and reused from L1 across the rows.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
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

// The same for bfloat16 bits (x, w, y), fp32 accumulation. With AVX512-BF16 (the build machine's -march=native),
// 32 products per instruction (VDPBF16PS: pairs of bf16 products summed in fp32); otherwise widened lane by lane.
inline void skinny_linear_block_bf16(const uint16_t* x, const uint16_t* w, int64_t n, int64_t in, int64_t out,
                                     int64_t o_begin, int64_t o_end, uint16_t* y) {
  for (int64_t o0 = o_begin; o0 < o_end; o0 += kLinearBlock) {
    const int64_t m = (o_end - o0) < kLinearBlock ? (o_end - o0) : kLinearBlock;
    for (int64_t r = 0; r < n; ++r) {
      const uint16_t* xr = x + r * in;
      float s[kLinearBlock] = {};
      int64_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
      __m512 acc[kLinearBlock];
      for (int j = 0; j < kLinearBlock; ++j) acc[j] = _mm512_setzero_ps();
      if (r == 0) {  // the weights come from DRAM: ask for the block after next now (~7 % faster when cold)
        const int64_t ahead = o0 + 2 * kLinearBlock;
        for (int64_t j = ahead; j < ahead + kLinearBlock && j < out; ++j)
          for (int64_t b = 0; b < in * 2; b += 64)
            _mm_prefetch(reinterpret_cast<const char*>(w + j * in) + b, _MM_HINT_T0);
      }
      for (; i + 32 <= in; i += 32) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xr + i);
        for (int64_t j = 0; j < m; ++j)
          acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(w + (o0 + j) * in + i), xv);
      }
      for (int64_t j = 0; j < m; ++j) s[j] = _mm512_reduce_add_ps(acc[j]);
#else
      for (int64_t j = 0; j < m; ++j) {
        const uint16_t* wr = w + (o0 + j) * in;
        float acc[kLinearLanes] = {};
        int64_t k = 0;
        for (; k + kLinearLanes <= in; k += kLinearLanes)
          for (int l = 0; l < kLinearLanes; ++l) acc[l] += bf16_to_float(xr[k + l]) * bf16_to_float(wr[k + l]);
        for (int l = 0; l < kLinearLanes; ++l) s[j] += acc[l];
      }
      i = (in / kLinearLanes) * kLinearLanes;
#endif
      for (int64_t j = 0; j < m; ++j) {
        const uint16_t* wr = w + (o0 + j) * in;
        for (int64_t k = i; k < in; ++k) s[j] += bf16_to_float(xr[k]) * bf16_to_float(wr[k]);
        y[r * out + o0 + j] = float_to_bf16(s[j]);
      }
    }
  }
}

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
