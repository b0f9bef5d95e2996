// CUDA kernels: sample_categorical, gumbel_topk, process_logits. One block per row.
#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace specdec {
namespace cuda {

constexpr double kSworMassEps = 1e-7;  // Gumbel-top-k: stop drawing once the remaining draft mass is this small

__global__ void sample_categorical_kernel(const float* __restrict__ logp,    // [R, V]
                                          const double* __restrict__ noise,  // [R, V] or nullptr: drawn (seed)
                                          uint64_t seed,
                                          int64_t* __restrict__ out,         // [R]
                                          int64_t V) {
  const int64_t row = blockIdx.x;
  const int64_t tok = row_argmax<true>(logp + row * V, noise_row(noise, V, seed, kDraftNoise, row), V);
  if (threadIdx.x == 0) out[row] = tok;
}

// k passes; pass j takes the best (score desc, index asc) strictly after the previous pick, so the picks come
// out in the reference's stable-sort order without a sort.
__global__ void gumbel_topk_kernel(const float* __restrict__ logp,    // [R, V]
                                   const double* __restrict__ noise,  // [R, V] or nullptr: drawn (seed)
                                   uint64_t seed,
                                   int64_t* __restrict__ tokens,      // [R, K]
                                   bool* __restrict__ valid,          // [R, K]
                                   double* __restrict__ score,        // [R, K]
                                   int64_t V, int64_t K) {
  const int64_t row = blockIdx.x;
  const float* lp = logp + row * V;
  const NoiseRow u = noise_row(noise, V, seed, kDraftNoise, row);
  double prev_s = CUDART_INF;
  int64_t prev_i = -1;
  double mass = 0.0;
  for (int64_t j = 0; j < K; ++j) {
    ArgBest best{-CUDART_INF, INT64_MAX};
    for_each_noise(u, V, [&](int64_t v, double uv) {
      const double s = static_cast<double>(lp[v]) + gumbel(uv);
      if (s < prev_s || (s == prev_s && v > prev_i)) best = pick(best, ArgBest{s, v});
    });
    best = block_argbest(best);
    if (threadIdx.x == 0) {
      const bool finite = best.v > -CUDART_INF && best.i != INT64_MAX;
      const bool ok = finite && (1.0 - mass) > kSworMassEps;
      if (finite) mass += ::exp(static_cast<double>(lp[best.i]));
      tokens[row * K + j] = ok ? best.i : -1;
      valid[row * K + j] = ok;
      score[row * K + j] = ok ? best.v : -CUDART_INF;
    }
    prev_s = best.v;
    prev_i = best.i;
  }
}

// Monotone map of a float to uint32 (larger float -> larger key), for exact radix-style selection.
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t b = bits_of(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Temperature -> top-k (ties at the boundary kept) -> top-p (shortest prefix of the stable descending
// order whose mass reaches top_p) -> fp32 log-softmax. T < 1e-5: one-hot argmax row.
__global__ void process_logits_kernel(const float* __restrict__ logits,  // [R, V] fp32 (cast by the binding)
                                      float* __restrict__ out,           // [R, V] fp32 log-probs
                                      int64_t V, float temperature, int64_t top_k, double top_p, bool greedy) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * V;
  float* o = out + row * V;
  if (greedy) {
    const int64_t a = row_argmax<true>(z, V);
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) o[v] = v == a ? 0.0f : -CUDART_INF_F;
    return;
  }
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) o[v] = z[v] / temperature;
  __syncthreads();
  if (top_k > 0 && top_k < V) {
    // largest key t with count(key >= t) >= k is the key of the k-th largest value
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      int64_t c = 0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) c += order_key(o[v]) >= mid;
      c = block_sum<long long>(static_cast<long long>(c));
      if (c >= top_k) lo = mid; else hi = mid - 1;
    }
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
      if (order_key(o[v]) < lo) o[v] = -CUDART_INF_F;
    __syncthreads();
  }
  float mx = -CUDART_INF_F;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, o[v]);
  mx = static_cast<float>(block_argbest(ArgBest{static_cast<double>(mx), 0}).v);
  float se = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) se += expf(o[v] - mx);
  se = block_sum<float>(se);
  if (top_p < 1.0) {
    // t* = smallest probability value whose strictly-greater mass is < top_p (a present value by construction)
    uint32_t lo = 0, hi = 0x7f800000u;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const float t = float_of(mid);
      double m = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const float pv = expf(o[v] - mx) / se;
        if (pv > t) m += pv;
      }
      m = block_sum<double>(m);
      if (m < top_p) hi = mid; else lo = mid + 1;
    }
    const float t_star = float_of(lo);
    double above = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float pv = expf(o[v] - mx) / se;
      if (pv > t_star) above += pv;
    }
    above = block_sum<double>(above);
    // ties at t*: kept in token-id order while the mass before them stays < top_p
    __shared__ long long tie_base;
    if (threadIdx.x == 0) tie_base = 0;
    __syncthreads();
    for (int64_t start = 0; start < V; start += blockDim.x) {
      const int64_t v = start + threadIdx.x;
      const float pv = v < V ? expf(o[v] - mx) / se : 0.0f;
      const bool tie = v < V && pv == t_star;
      const bool below = v < V && pv < t_star;
      // exclusive count of ties before v inside this chunk (warp ballots, then warp offsets)
      const unsigned ballot = __ballot_sync(0xffffffffu, tie);
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      __shared__ int warp_ties[kWarps];
      if (lane == 0) warp_ties[warp] = __popc(ballot);
      __syncthreads();
      long long before = tie_base + __popc(ballot & ((1u << lane) - 1u));
      for (int w = 0; w < warp; ++w) before += warp_ties[w];
      if (below || (tie && above + static_cast<double>(t_star) * static_cast<double>(before) >= top_p))
        o[v] = -CUDART_INF_F;
      __syncthreads();
      if (threadIdx.x == 0)
        for (int w = 0; w < kWarps; ++w) tie_base += warp_ties[w];
      __syncthreads();
    }
    // renormalise over the kept tokens
    se = 0.0f;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) se += expf(o[v] - mx);
    se = block_sum<float>(se);
  }
  const float lse = logf(se);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) o[v] = o[v] - mx - lse;
}

}  // namespace cuda
}  // namespace specdec

using namespace specdec::cuda;

extern "C" int specdec_cuda_sample_categorical(const float* logp, const double* noise, uint64_t seed, int64_t* out,
                                               int64_t rows, int64_t V, void* stream) {
  if (rows == 0) return 0;
  sample_categorical_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logp, noise, seed, out, V);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_gumbel_topk(const float* logp, const double* noise, uint64_t seed, int64_t* tokens,
                                        bool* valid, double* score, int64_t rows, int64_t V, int64_t K,
                                        void* stream) {
  if (rows == 0 || K == 0) return 0;
  gumbel_topk_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logp, noise, seed, tokens, valid,
                                                                               score, V, K);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_process_logits(const float* logits, float* out, int64_t rows, int64_t V,
                                           double temperature, int64_t top_k, double top_p, void* stream) {
  if (rows == 0) return 0;
  const bool greedy = temperature < 1e-5;
  process_logits_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      logits, out, V, greedy ? 1.0f : static_cast<float>(temperature), top_k, top_p, greedy);
  return static_cast<int>(cudaGetLastError());
}
