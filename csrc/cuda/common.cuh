// Block-level reductions shared by the CUDA kernels: one thread block processes one row and strides over the
// vocabulary. Framework-free: raw pointers and sizes only (DESIGN.md §7.1).
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

// Larger value first, ties to the lower index (DESIGN.md §3), identical to the reference's stable sort.
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

// argmax_v of log(x[v]) (LOG_INPUT = false: x holds probabilities) or x[v] (log-probs), plus Gumbel(noise[v])
// when noise is given; the whole block cooperates and every thread gets the token.
template <bool LOG_INPUT>
__device__ int64_t row_argmax(const float* x,        // [V]
                              const double* noise,   // [V] or nullptr
                              int64_t V) {
  ArgBest best{-CUDART_INF, INT64_MAX};
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const double xv = static_cast<double>(x[v]);
    double s = LOG_INPUT ? xv : (xv > 0.0 ? ::log(xv) : -CUDART_INF);
    if (noise != nullptr) s += gumbel(noise[v]);
    best = pick(best, ArgBest{s, v});
  }
  best = block_argbest(best);
  return best.i == INT64_MAX ? 0 : best.i;
}

}  // namespace cuda
}  // namespace specdec
