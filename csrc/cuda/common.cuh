// Block-level reductions shared by the CUDA kernels: one thread block processes one row and strides over the
// vocabulary. Framework-free: raw pointers and sizes only.
#pragma once

#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstdint>

#include "specdec/common.h"

namespace specdec {
namespace cuda {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct ArgBest {
  double v;
  int64_t i;
};

// Larger value first, ties to the lower index, identical to the reference's stable sort.
__device__ __forceinline__ ArgBest pick(ArgBest a, ArgBest b) { return beats(a.v, a.i, b.v, b.i) ? a : b; }

__device__ __forceinline__ ArgBest warp_argbest(ArgBest x) {
  for (int off = 16; off > 0; off >>= 1) {
    ArgBest o{__shfl_down_sync(0xffffffffu, x.v, off), __shfl_down_sync(0xffffffffu, x.i, off)};
    x = pick(x, o);
  }
  return x;
}

// Every thread returns the block-wide best.
__device__ __forceinline__ ArgBest block_argbest(ArgBest x) {
  __shared__ double sv[kWarps];
  __shared__ int64_t si[kWarps];
  __shared__ ArgBest out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = warp_argbest(x);
  if (lane == 0) {
    sv[warp] = x.v;
    si[warp] = x.i;
  }
  __syncthreads();
  if (warp == 0) {
    ArgBest y = lane < kWarps ? ArgBest{sv[lane], si[lane]} : ArgBest{-CUDART_INF, INT64_MAX};
    y = warp_argbest(y);
    if (lane == 0) out = y;
  }
  __syncthreads();
  ArgBest r = out;
  __syncthreads();
  return r;
}

template <typename T>
__device__ __forceinline__ T block_sum(T x) {
  __shared__ T s[kWarps];
  __shared__ T out;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(0xffffffffu, x, off);
  if (lane == 0) s[warp] = x;
  __syncthreads();
  if (warp == 0) {
    T y = lane < kWarps ? s[lane] : T(0);
    for (int off = 16; off > 0; off >>= 1) y += __shfl_down_sync(0xffffffffu, y, off);
    if (lane == 0) out = y;
  }
  __syncthreads();
  T r = out;
  __syncthreads();
  return r;
}

// ---- noise (docs/kernels.md): a row of the caller's float64 uniforms, or drawn here from the Philox stream ----

// Elements 2j and 2j + 1 of noise row `row` of the stream (seed, purpose): one Philox call gives both (the
// layout of specdec_kernels/_rng.py and philox_uniform in specdec/common.h).
SPECDEC_HD void philox_pair(uint64_t seed, uint32_t purpose, uint64_t row, uint64_t j, double* a, double* b) {
  uint32_t c[4] = {static_cast<uint32_t>(j), static_cast<uint32_t>(row), static_cast<uint32_t>(row >> 32), purpose};
  philox4x32_10(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  *a = philox_u52(c[0], c[1]);
  *b = philox_u52(c[2], c[3]);
}

// One noise row of an op: `u` points at the row of the noise tensor (test mode), or is nullptr and the elements
// are drawn in the kernel from row `row` of the stream (seed, purpose), bit-identical to the other backends.
struct NoiseRow {
  const double* u;
  uint64_t seed;
  uint32_t purpose;
  uint64_t row;

  // element i
  SPECDEC_HD double at(int64_t i) const {
    return u != nullptr ? u[i] : philox_uniform(seed, purpose, row, static_cast<uint64_t>(i));
  }

  // elements 2j and 2j + 1 of a row of n; *b is 0 when 2j + 1 == n
  SPECDEC_HD void pair(int64_t j, int64_t n, double* a, double* b) const {
    if (u != nullptr) {
      *a = u[2 * j];
      *b = 2 * j + 1 < n ? u[2 * j + 1] : 0.0;
    } else {
      philox_pair(seed, purpose, row, static_cast<uint64_t>(j), a, b);
    }
  }
};

// Row `row` of a [rows, n] float64 noise tensor, or of the stream (seed, purpose) when noise is nullptr.
SPECDEC_HD NoiseRow noise_row(const double* noise, int64_t n, uint64_t seed, uint32_t purpose, int64_t row) {
  return NoiseRow{noise != nullptr ? noise + row * n : nullptr, seed, purpose, static_cast<uint64_t>(row)};
}

// f(v, u_v) for this thread's share of v in [0, V): the block strides over pairs (2j, 2j + 1), so a drawn row
// costs one Philox call per pair. The races fold with the total order of pick, so the visit order is irrelevant.
template <typename F>
__device__ __forceinline__ void for_each_noise(const NoiseRow& nz, int64_t V, F f) {
  for (int64_t j = threadIdx.x; 2 * j < V; j += blockDim.x) {
    double a, b;
    nz.pair(j, V, &a, &b);
    f(2 * j, a);
    if (2 * j + 1 < V) f(2 * j + 1, b);
  }
}

template <bool LOG_INPUT>
__device__ __forceinline__ double log_score(float x) {
  const double xv = static_cast<double>(x);
  return LOG_INPUT ? xv : (xv > 0.0 ? ::log(xv) : -CUDART_INF);
}

// argmax_v of log(x[v]) (LOG_INPUT = false: x holds probabilities) or x[v] (log-probs), lowest index on ties;
// the whole block cooperates and every thread gets the token.
template <bool LOG_INPUT>
__device__ int64_t row_argmax(const float* x,  // [V]
                              int64_t V) {
  ArgBest best{-CUDART_INF, INT64_MAX};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) best = pick(best, ArgBest{log_score<LOG_INPUT>(x[v]), v});
  best = block_argbest(best);
  return best.i == INT64_MAX ? 0 : best.i;
}

// The same race perturbed by Gumbel(noise[v]): a Gumbel-max sample of the row.
template <bool LOG_INPUT>
__device__ int64_t row_argmax(const float* x,  // [V]
                              const NoiseRow& noise, int64_t V) {
  ArgBest best{-CUDART_INF, INT64_MAX};
  for_each_noise(noise, V, [&](int64_t v, double u) {
    best = pick(best, ArgBest{log_score<LOG_INPUT>(x[v]) + gumbel(u), v});
  });
  best = block_argbest(best);
  return best.i == INT64_MAX ? 0 : best.i;
}

}  // namespace cuda
}  // namespace specdec
