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
#elif defined(__AVX512F__) && defined(__FMA__)
#include <immintrin.h>
#define SPECDEC_LINEAR_AVX512F 1
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

// A weight as a float (bf16 bits or int8), and an output stored from its fp32 sum (bf16 bits or float).
inline float weight_value(uint16_t b) { return bf16_to_float(b); }
inline float weight_value(int8_t v) { return static_cast<float>(v); }
inline void store_value(uint16_t* y, float v) { *y = float_to_bf16(v); }
inline void store_value(float* y, float v) { *y = v; }

// y[r, o] = sum_i x[r, i] * w[o, i] for o in [o_begin, o_end), r in [0, n); x float/double, accumulated in T; w of
// x's type, or int8 with one scale per output (each sum then multiplied by scale[o]; scale null for float weights).
// The path of CPUs without AVX2, of double, and of float x with float weights.
template <typename T, typename TW = T>
void skinny_linear_block(const T* x, const TW* w, const float* scale, int64_t n, int64_t in, int64_t out,
                         int64_t o_begin, int64_t o_end, T* y) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const TW* wr = w + o * in;
    for (int64_t r = 0; r < n; ++r) {
      const T* xr = x + r * in;
      T acc[kLinearLanes] = {};
      int64_t i = 0;
      for (; i + kLinearLanes <= in; i += kLinearLanes)
        for (int j = 0; j < kLinearLanes; ++j) acc[j] += xr[i + j] * static_cast<T>(wr[i + j]);
      T s = 0;
      for (int j = 0; j < kLinearLanes; ++j) s += acc[j];
      for (; i < in; ++i) s += xr[i] * static_cast<T>(wr[i]);
      y[r * out + o] = scale == nullptr ? s : s * static_cast<T>(scale[o]);
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

#if defined(__AVX512F__)
// 16 bf16 values widened to fp32 (a bf16 is the top half of its fp32)
inline __m512 widen_bf16x16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

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

// A tile's R x O accumulators summed, each over its 16 lanes in the tree of _mm512_reduce_add_ps, into s (row-major,
// flat): eight accumulators per transposing tree, then four, then one at a time. Summed one by one (about 8 shuffles
// and adds each, against 3 in a tree of 8), the sums of a tile of 2 W rows x 8 rows of 576 inputs would take about
// 40 % as many instructions as its VDPBF16PS products. Every accumulator goes through the same tree whichever group
// it falls in, so the sums do not depend on R.
template <int R, int O>
__attribute__((always_inline)) inline void sum_tile_avx512(const __m512 (&a)[R][O], float* s) {
  constexpr int K = R * O;
#pragma GCC unroll 8
  for (int k = 0; k + 8 <= K; k += 8)
    _mm256_storeu_ps(s + k, sum_lanes_avx512(a[k / O][k % O], a[(k + 1) / O][(k + 1) % O],
                                             a[(k + 2) / O][(k + 2) % O], a[(k + 3) / O][(k + 3) % O],
                                             a[(k + 4) / O][(k + 4) % O], a[(k + 5) / O][(k + 5) % O],
                                             a[(k + 6) / O][(k + 6) % O], a[(k + 7) / O][(k + 7) % O]));
  constexpr int k4 = K / 8 * 8;
  if constexpr (K - k4 >= 4)
    _mm_storeu_ps(s + k4, sum_lanes_avx512(a[k4 / O][k4 % O], a[(k4 + 1) / O][(k4 + 1) % O],
                                           a[(k4 + 2) / O][(k4 + 2) % O], a[(k4 + 3) / O][(k4 + 3) % O]));
  constexpr int k1 = K - k4 >= 4 ? k4 + 4 : k4;
#pragma GCC unroll 8
  for (int k = k1; k < K; ++k) s[k] = _mm512_reduce_add_ps(a[k / O][k % O]);
}
#endif

// Output features per block of the bf16 paths (the unit the adapter's OpenMP loop hands out).
#if defined(SPECDEC_LINEAR_AVX512BF16) || defined(SPECDEC_LINEAR_AVX512F)
constexpr int64_t kLinearBlockBf16 = 16;
#else
constexpr int64_t kLinearBlockBf16 = kLinearBlock;
#endif

// Tiling of the vector paths: tiles of O rows of W x R rows of x, R and O template arguments so that the R * O
// accumulators stay in registers. Every tiling adds the same products in the same order per (row, output), so the
// choice changes speed only: row r of a call equals a call on row r alone. Rows of x go MaxR at a time in one
// sweep over W, so the weights' trip from memory overlaps every row's products; a later group of rows (more than
// MaxR) reads the tile's W rows again, from L1.
template <int O, int R, typename Tile>
inline void tile_rows(int64_t nr, const Tile& tile, int64_t r0, int64_t o0, int64_t m) {
  if constexpr (R > 1)
    if (nr < R) return tile_rows<O, R - 1>(nr, tile, r0, o0, m);
  tile.template operator()<R, O>(r0, o0, m);
}

template <int O, int MaxR, typename Tile>
inline void sweep_rows(int64_t n, int64_t o_begin, int64_t o_end, const Tile& tile) {
  for (int64_t o0 = o_begin; o0 < o_end; o0 += O)
    for (int64_t r0 = 0; r0 < n; r0 += MaxR)
      tile_rows<O, MaxR>(n - r0 < MaxR ? n - r0 : MaxR, tile, r0, o0, o_end - o0 < O ? o_end - o0 : O);
}

// The three regimes every vector path tiles by: one or two rows (an AR step, a draft step) with OFew W rows per
// tile; 3 to 6 rows (verification passes) all at once with OMid W rows; more, RMany rows at a time with OMany W
// rows (W read from memory once by the first group of a tile, from L1 by the others).
template <int OFew, int OMid, int OMany, int RMany = 8, typename Tile>
inline void sweep_by_rows(int64_t n, int64_t o_begin, int64_t o_end, const Tile& tile) {
  if (n <= 2)
    sweep_rows<OFew, 2>(n, o_begin, o_end, tile);
  else if (n <= 6)
    sweep_rows<OMid, 6>(n, o_begin, o_end, tile);
  else
    sweep_rows<OMany, RMany>(n, o_begin, o_end, tile);
}

#if defined(SPECDEC_LINEAR_AVX512BF16)
// AVX512-BF16: 32 products per instruction (VDPBF16PS: pairs of bf16 products summed into 16 fp32 lanes). A tile
// is R rows of x against O rows of W: each 32-element chunk of a W row is loaded once and feeds R rows' dot
// products (R * O independent accumulators), so a verification pass of a few rows costs about what one row does
// (the weights' trip from memory). A row's 16 lanes are summed in the tree of _mm512_reduce_add_ps (lanes k and
// k + 8, then k and k + 4, k and k + 2, k and k + 1; sum_tile_avx512); every tile runs the same chunks in the same
// order per (row, output), so row r of a call equals a call on row r alone.

// W is prefetched into L2 ahead of each row a tile reads, by kPrefetchBytesL2 or by the tile's own footprint (its O
// rows of W) where that is larger: with the hardware prefetcher alone, or prefetches into L1 (whose few fill buffers
// cap the misses in flight), the stream falls well short of memory speed once each chunk feeds several rows'
// products; and with wide rows (a 1B model's 2048 or 8192 inputs) a fixed distance would ask for lines the tile is
// about to read anyway (a tile ahead streams ~8 % faster there on Zen 4).
constexpr int64_t kPrefetchBytesL2 = 16384;  // a prefetch never faults, so running past the end of W is harmless

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
// Prefetch: ask for W ahead (kPrefetchBytesL2 or a tile; the first row group of a tile, later groups find it in L1).
template <int R, int O, bool Prefetch>
inline void skinny_tile_bf16_avx512(const uint16_t* x, const uint16_t* w, int64_t in, int64_t out, int64_t r0,
                                    int64_t o0, int64_t m, uint16_t* y) {
  const int64_t in32 = in / 32 * 32;
  const int64_t ahead = O * in * 2 > kPrefetchBytesL2 ? O * in * 2 : kPrefetchBytesL2;  // bytes
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
        _mm_prefetch(reinterpret_cast<const char*>(wr[j] + i) + ahead, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      __m512bh v = (__m512bh)_mm512_loadu_si512(x + (r0 + q) * in + i);
      if constexpr (O > 1) __asm__("" : "+v"(v));  // keep v in a register: GCC would fold one load into each product
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j) a[q][j] = _mm512_dpbf16_ps(a[q][j], u[j], v);
    }
  }
  float s[R][O];
  sum_tile_avx512<R, O>(a, &s[0][0]);
  if (in32 == in && m == O) {  // no tail, no padding: the row's O outputs stored at once
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      uint16_t* yr = y + (r0 + q) * out + o0;
      if constexpr (O == 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yr), float_to_bf16x8(_mm256_loadu_ps(s[q])));
      } else if constexpr (O == 4) {
        _mm_storel_epi64(reinterpret_cast<__m128i*>(yr), float_to_bf16x8(_mm256_castps128_ps256(_mm_loadu_ps(s[q]))));
      } else {
#pragma GCC unroll 8
        for (int j = 0; j < O; ++j) yr[j] = float_to_bf16(s[q][j]);
      }
    }
    return;
  }
  for (int q = 0; q < R; ++q) {
    const uint16_t* xr = x + (r0 + q) * in;
    for (int j = 0; j < m; ++j) {
      for (int64_t k = in32; k < in; ++k) s[q][j] += bf16_to_float(xr[k]) * bf16_to_float(wr[j][k]);
      y[(r0 + q) * out + o0 + j] = float_to_bf16(s[q][j]);
    }
  }
}

// One or two rows (an AR step, a draft step): 8 W rows per tile (8 or 16 independent accumulators). 3 to 6 rows
// (verification passes): 4 W rows x all rows (up to 24 accumulators and 4 chunks of W in the 32 zmm registers).
// More: 4 W rows x 8 rows at a time, so a pass of up to 8 tokens reads W once. Its 32 accumulators overflow the
// registers, yet on Zen 4 it runs 7-16 rows ~1.1x faster than 2 W rows x 8 rows, in cache and from memory (each
// chunk of x feeds twice the products). W is prefetched by the first group of rows of a tile only; later groups
// find it in L1.
inline void skinny_linear_block_bf16_avx512(const uint16_t* x, const uint16_t* w, int64_t n, int64_t in,
                                            int64_t out, int64_t o_begin, int64_t o_end, uint16_t* y) {
  const auto tile = [&]<int R, int O>(int64_t r0, int64_t o0, int64_t m) {
    if (r0 == 0)
      skinny_tile_bf16_avx512<R, O, true>(x, w, in, out, r0, o0, m, y);
    else
      skinny_tile_bf16_avx512<R, O, false>(x, w, in, out, r0, o0, m, y);
  };
  sweep_by_rows<8, 4, 4>(n, o_begin, o_end, tile);
}
#endif

#if defined(SPECDEC_LINEAR_AVX512BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SPECDEC_LINEAR_AMX 1
// AMX-BF16 (TDPBF16PS: a 16 x 16 x 32 bf16 product into fp32 tiles per instruction). The roles are swapped so that W
// needs no repacking: a tile of W (16 output features x 32 inputs, read straight from its rows) is the left operand,
// and the right one is a chunk of x packed once per call as pairs (the instruction's layout: row p holds inputs
// 2p, 2p + 1 of every row of x). The accumulator tile then holds 16 outputs x up to 16 rows of x. The instruction
// sums each (output, row) over the chunk in a fixed order that does not depend on the other rows, and the chunks
// run in the same order for every row count, so row r of a call equals a call on row r alone; and since the
// arithmetic of 16 rows costs what one row does, a verification pass of up to 16 tokens reads W once at memory
// speed like a one-token step. Inputs past the last whole 32-element chunk are added in fp32 after the tiles.
// The instruction treats bf16 subnormals as zero.
constexpr int kAmxRows = 16;        // rows of x per group: the accumulator tile's columns
constexpr int64_t kAmxBlock = 64;   // output features per block: 4 accumulator tiles of 16

struct alignas(64) AmxTileConfig {  // the LDTILECFG memory layout, palette 1
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles 0-3: accumulators (16 outputs x nr rows, fp32); 4: the chunk of packed x (16 pairs x nr rows); 5-7: chunks
// of W (16 outputs x 32 inputs).
inline void amx_configure(int nr) {
  AmxTileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 5; ++t) cfg.rows[t] = 16, cfg.colsb[t] = static_cast<uint16_t>(nr * 4);
  for (int t = 5; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// Rows [r0, r0 + nr) of x as 32-bit pairs: xp[p * nr + r] = (x[r0 + r, 2p], x[r0 + r, 2p + 1]), 2p < in32.
inline void amx_pack_rows(const uint16_t* x, int64_t in, int64_t in32, int64_t r0, int nr, uint32_t* xp) {
  for (int r = 0; r < nr; ++r) {
    const uint16_t* xr = x + (r0 + r) * in;
    for (int64_t p = 0; p < in32 / 2; ++p) {
      uint32_t pair;
      std::memcpy(&pair, xr + 2 * p, sizeof pair);
      xp[p * nr + r] = pair;
    }
  }
}

// NB tiles of W (wt[j]: 16 rows with W's row stride) against packed x; c[j] gets tile j as [16 outputs][16] fp32.
template <int NB>
inline void amx_tiles(const uint32_t* xp, const uint16_t* const* wt, int64_t in, int64_t in32, int nr, float* c) {
  const int64_t stride = in * 2;
  _tile_zero(0);
  if constexpr (NB >= 2) _tile_zero(1);
  if constexpr (NB >= 3) _tile_zero(2);
  if constexpr (NB >= 4) _tile_zero(3);
  for (int64_t k = 0; k < in32; k += 32) {
    _tile_loadd(4, xp + (k / 2) * nr, nr * 4);
    _tile_loadd(5, wt[0] + k, stride);
    _tile_dpbf16ps(0, 5, 4);
    if constexpr (NB >= 2) {
      _tile_loadd(6, wt[1] + k, stride);
      _tile_dpbf16ps(1, 6, 4);
    }
    if constexpr (NB >= 3) {
      _tile_loadd(7, wt[2] + k, stride);
      _tile_dpbf16ps(2, 7, 4);
    }
    if constexpr (NB >= 4) {
      _tile_loadd(5, wt[3] + k, stride);
      _tile_dpbf16ps(3, 5, 4);
    }
  }
  _tile_stored(0, c, 64);
  if constexpr (NB >= 2) _tile_stored(1, c + 256, 64);
  if constexpr (NB >= 3) _tile_stored(2, c + 512, 64);
  if constexpr (NB >= 4) _tile_stored(3, c + 768, 64);
}

// The products of the m <= kAmxBlock W rows from w (``in`` values each) with the packed rows xp, in c as amx_tiles
// leaves them, for ceil(m / 16) tiles (returned). pad: scratch of 16 * in values for a last tile of fewer than 16 W
// rows (a tile load reads 16 rows: the last ones are copied there, the rest zeroed).
inline int amx_block_tiles(const uint32_t* xp, const uint16_t* w, int64_t m, int64_t in, int64_t in32, int nr,
                           uint16_t* pad, float* c) {
  const int nb = static_cast<int>((m + 15) / 16);
  const uint16_t* wt[4];
  for (int j = 0; j < nb; ++j) wt[j] = w + 16 * j * in;
  if (m % 16 != 0) {
    const int64_t rows = m % 16;
    std::memcpy(pad, wt[nb - 1], rows * in * sizeof(uint16_t));
    std::memset(pad + rows * in, 0, (16 - rows) * in * sizeof(uint16_t));
    wt[nb - 1] = pad;
  }
  switch (nb) {
    case 4: amx_tiles<4>(xp, wt, in, in32, nr, c); break;
    case 3: amx_tiles<3>(xp, wt, in, in32, nr, c); break;
    case 2: amx_tiles<2>(xp, wt, in, in32, nr, c); break;
    default: amx_tiles<1>(xp, wt, in, in32, nr, c);
  }
  return nb;
}

// Row r's 16 outputs of tile j of amx_tiles' c (each tile [16 outputs][16 rows]).
inline __m512 amx_tile_row(const float* c, int j, int r) {
  const __m512i col = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
  return _mm512_i32gather_ps(col, c + 256 * j + r, 4);
}

// Outputs [o0, o0 + m), m <= kAmxBlock, of rows [r0, r0 + nr) (x packed in xp); the tile configured for nr rows.
// pad: scratch of 16 * in values for a last tile of fewer than 16 W rows (a tile load reads 16 rows).
inline void skinny_block_bf16_amx(const uint16_t* x, const uint32_t* xp, const uint16_t* w, int64_t in, int64_t out,
                                  int64_t r0, int nr, int64_t o0, int64_t m, uint16_t* pad, uint16_t* y) {
  const int64_t in32 = in / 32 * 32;
  alignas(64) float c[4 * 256];
  const int nb = amx_block_tiles(xp, w + o0 * in, m, in, in32, nr, pad, c);
  for (int j = 0; j < nb; ++j) {
    const int64_t mj = (m - 16 * j) < 16 ? (m - 16 * j) : 16;
    const uint16_t* wj = w + (o0 + 16 * j) * in;
    for (int r = 0; r < nr; ++r) {
      __m512 v = amx_tile_row(c, j, r);
      if (in32 < in) {  // the inputs past the last whole chunk, in order, in fp32
        alignas(64) float s[16];
        _mm512_store_ps(s, v);
        const uint16_t* xr = x + (r0 + r) * in;
        for (int64_t o = 0; o < mj; ++o)
          for (int64_t k = in32; k < in; ++k) s[o] += bf16_to_float(xr[k]) * bf16_to_float(wj[o * in + k]);
        v = _mm512_load_ps(s);
      }
      const __m128i lo = float_to_bf16x8(_mm512_castps512_ps256(v));
      const __m128i hi = float_to_bf16x8(_mm512_extractf32x8_ps(v, 1));
      uint16_t* yr = y + (r0 + r) * out + o0 + 16 * j;
      if (mj == 16) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yr), lo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yr + 8), hi);
      } else {
        alignas(16) uint16_t t[16];
        _mm_store_si128(reinterpret_cast<__m128i*>(t), lo);
        _mm_store_si128(reinterpret_cast<__m128i*>(t + 8), hi);
        std::memcpy(yr, t, mj * sizeof(uint16_t));
      }
    }
  }
}
#endif

#if defined(__AVX512F__)
// AVX-512F FMA tiles: the bf16 path of CPUs without bf16 dot products, and the int8-weight path of every AVX-512
// build. x comes widened to fp32 once per call (xf [n, in]); each 16-element chunk of a W row is widened once in
// registers and feeds every row of the tile's FMAs (up to 24 accumulators), so the extra rows of a verification
// pass cost arithmetic, not another trip through W. Every row's sum runs the same lanes in the same order (then
// the tree of sum_tile_avx512) whichever rows share its call, so row r of a call equals a call on row r alone.
constexpr int kPrefetchBytesAvx512 = 16384;  // into L2, as in the AVX512-BF16 path; a prefetch never faults

inline __m512 widen_x16(const uint16_t* p) { return widen_bf16x16(p); }  // bf16 bits
inline __m512 widen_x16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Rows [r0, r0 + R) of x against W rows [o0, o0 + m), m <= O (padding columns repeat row o0 and are dropped);
// TW: bf16 bits or int8 (then each output is multiplied by scale[o] after its sum); TY: bf16 bits or float.
template <int R, int O, typename TW, typename TY>
inline void skinny_tile_avx512f(const float* xf, const TW* w, const float* scale, int64_t in, int64_t out,
                                int64_t r0, int64_t o0, int64_t m, TY* y) {
  constexpr int64_t kLine = 64 / sizeof(TW);  // elements per cache line of W
  const int64_t in16 = in / 16 * 16;
  const TW* wr[O];
  for (int j = 0; j < O; ++j) wr[j] = w + (o0 + (j < m ? j : 0)) * in;
  __m512 a[R][O];
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) a[q][j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < in16; i += 16) {
    __m512 u[O];
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) u[j] = widen_x16(wr[j] + i);
    if ((i & (kLine - 1)) == 0)  // one prefetch per line; W's rows are contiguous, so this runs into later tiles'
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(wr[j] + i) + kPrefetchBytesAvx512, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      __m512 v = _mm512_loadu_ps(xf + (r0 + q) * in + i);
      if constexpr (O > 1) __asm__("" : "+v"(v));  // keep v in a register: GCC would fold one load into each FMA
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j) a[q][j] = _mm512_fmadd_ps(u[j], v, a[q][j]);
    }
  }
  float s[R][O];
  sum_tile_avx512<R, O>(a, &s[0][0]);
  for (int q = 0; q < R; ++q) {
    const float* xr = xf + (r0 + q) * in;
    for (int j = 0; j < m; ++j) {
      float t = s[q][j];
      for (int64_t k = in16; k < in; ++k) t += xr[k] * weight_value(wr[j][k]);
      store_value(y + (r0 + q) * out + o0 + j, scale == nullptr ? t : t * scale[o0 + j]);
    }
  }
}

// The tiles: 8 W rows for one or two rows, 4 W rows x 3 to 6 rows, 2 W rows x 8 rows at a time beyond.
template <typename TW, typename TY>
inline void skinny_linear_block_avx512f(const float* xf, const TW* w, const float* scale, int64_t n, int64_t in,
                                        int64_t out, int64_t o_begin, int64_t o_end, TY* y) {
  const auto tile = [&]<int R, int O>(int64_t r0, int64_t o0, int64_t m) {
    skinny_tile_avx512f<R, O>(xf, w, scale, in, out, r0, o0, m, y);
  };
  sweep_by_rows<8, 4, 2>(n, o_begin, o_end, tile);
}
#endif

#if defined(SPECDEC_LINEAR_AVX2)
// AVX2 + FMA, no bf16 dot-product instruction (the bf16 loop above would widen every weight once per row): x comes
// widened to fp32 once per call (xf [n, in]); each 8-wide chunk of a W row is widened in registers and used for up
// to six rows of x (more rows: four at a time, W from L1 after the first), so the extra rows of a verification pass
// cost arithmetic, not another trip through W. Every
// row's sum runs the same lanes in the same order whichever rows share its call, so row r of a call equals a call on
// row r alone. The weights are prefetched into L2 kPrefetchBytes (or a tile) ahead: the hardware prefetcher alone
// does not keep the stream at memory speed, and prefetches into L1 (whose few fill buffers cap the misses in flight)
// fall well short of it. SmolLM2's linears read once from memory (270 MB, one row, a 2-core Zen 4 EPYC running this
// path): 43 ms with no prefetch, 31 ms into L1 4 KB ahead, 16-17 ms into L2 8 or 16 KB ahead.
constexpr int kPrefetchBytes = 8192;  // a prefetch never faults, so running past the end of W is harmless

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

inline __m256 widen_x8(const uint16_t* p) { return widen_bf16x8(p); }  // bf16 bits
inline __m256 widen_x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Rows [r0, r0 + R) of x against W rows [o0, o0 + m), m <= O (padding columns repeat row o0 and are dropped);
// TW: bf16 bits or int8 (then each output is multiplied by scale[o] after its sum); TY: bf16 bits or float.
template <int R, int O, typename TW, typename TY>
inline void skinny_tile_avx2(const float* xf, const TW* w, const float* scale, int64_t in, int64_t out, int64_t r0,
                             int64_t o0, int64_t m, TY* y) {
  constexpr int64_t kLine = 64 / sizeof(TW);  // elements per cache line of W
  const int64_t in8 = in / 8 * 8;
  // kPrefetchBytes ahead, or a tile ahead where a tile's rows span more (wide rows: ~15 % faster there on Zen 4)
  const int64_t tile_bytes = O * in * static_cast<int64_t>(sizeof(TW));
  const int64_t ahead = tile_bytes > kPrefetchBytes ? tile_bytes : kPrefetchBytes;
  const TW* wr[O];
  for (int j = 0; j < O; ++j) wr[j] = w + (o0 + (j < m ? j : 0)) * in;
  __m256 a[R][O];  // in registers only if every index is a constant: the loops over q and j are unrolled
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) a[q][j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < in8; i += 8) {
    __m256 u[O];
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) u[j] = widen_x8(wr[j] + i);
    if ((i & (kLine - 1)) == 0)  // one prefetch per line; W's rows are contiguous, so this runs into later tiles'
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j) _mm_prefetch(reinterpret_cast<const char*>(wr[j] + i) + ahead, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int q = 0; q < R; ++q) {
      __m256 v = _mm256_loadu_ps(xf + (r0 + q) * in + i);
      if constexpr (O > 1) __asm__("" : "+x"(v));  // keep v in a register: GCC would fold one load into each FMA
#pragma GCC unroll 8
      for (int j = 0; j < O; ++j) a[q][j] = _mm256_fmadd_ps(u[j], v, a[q][j]);
    }
  }
  float s[R][O];  // summed before the loop that runs to m, which would put the accumulators on the stack
#pragma GCC unroll 8
  for (int q = 0; q < R; ++q)
#pragma GCC unroll 8
    for (int j = 0; j < O; ++j) s[q][j] = sum_lanes(a[q][j]);
  for (int q = 0; q < R; ++q) {
    const float* xr = xf + (r0 + q) * in;
    for (int j = 0; j < m; ++j) {
      float t = s[q][j];
      for (int64_t k = in8; k < in; ++k) t += xr[k] * weight_value(wr[j][k]);
      store_value(y + (r0 + q) * out + o0 + j, scale == nullptr ? t : t * scale[o0 + j]);
    }
  }
}

// One or two rows (an AR step, a draft step): 4 W rows per tile, the widening amortised over few FMAs but the
// loop lean. 3 to 6 rows (verification passes): 2 W rows x all rows (12 accumulators in the 16 ymm registers), so
// each widened chunk feeds up to 12 FMAs. More: 2 W rows x 4 rows at a time, the next 4 rows reading the same two
// W rows again from L1. A tile of 2 x 8 (16 accumulators) overflows the registers and runs the FMAs at ~0.75x
// the rate of two 2 x 4 tiles (a 960 x 576 weight in cache, 8 rows, Zen 4); 1 W row x 8 rows is bound by its 9
// loads per 8 FMAs.
template <typename TW, typename TY>
inline void skinny_linear_block_avx2(const float* xf, const TW* w, const float* scale, int64_t n, int64_t in,
                                     int64_t out, int64_t o_begin, int64_t o_end, TY* y) {
  const auto tile = [&]<int R, int O>(int64_t r0, int64_t o0, int64_t m) {
    skinny_tile_avx2<R, O>(xf, w, scale, in, out, r0, o0, m, y);
  };
  sweep_by_rows<4, 2, 2, 4>(n, o_begin, o_end, tile);
}
#endif

}  // namespace specdec
