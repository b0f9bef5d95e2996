// CUDA kernels: spechub_sample (SpecHub drafting), kseq_gamma (K-SEQ), sbs_step (stochastic beam search). One block
// per row.
#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace specdec {
namespace cuda {

constexpr double kSworEps = 1e-7;  // Gumbel-top-k: stop drawing once the remaining draft mass is this small

// Best (score desc, index asc) of logp[v] + Gumbel strictly after (prev_s, prev_i) in that order.
__device__ ArgBest next_in_race(const float* lp, const NoiseRow& u, double offset, int64_t V, double prev_s,
                                int64_t prev_i) {
  ArgBest best{-CUDART_INF, INT64_MAX};
  for_each_noise(u, V, [&](int64_t v, double uv) {
    const double s = (offset + static_cast<double>(lp[v])) + gumbel(uv);
    if (s < prev_s || (s == prev_s && v > prev_i)) best = pick(best, ArgBest{s, v});
  });
  return block_argbest(best);
}

__global__ void spechub_sample_kernel(const float* __restrict__ logp,    // [R, V]
                                      const double* __restrict__ noise,  // [R, V] or nullptr: drawn (seed)
                                      uint64_t seed,
                                      int64_t* __restrict__ tokens,      // [R, 2]
                                      int64_t* __restrict__ hub_out,     // [R]
                                      bool* __restrict__ valid,          // [R, 2]
                                      int64_t V) {
  const int64_t row = blockIdx.x;
  const float* lp = logp + row * V;
  const NoiseRow u = noise_row(noise, V, seed, kDraftNoise, row);
  const int64_t hub = row_argmax<true>(lp, V);
  const ArgBest y1 = next_in_race(lp, u, 0.0, V, CUDART_INF, -1);
  const ArgBest y2 = next_in_race(lp, u, 0.0, V, y1.v, y1.i);
  if (threadIdx.x == 0) {
    const bool v2_topk = y2.v > -CUDART_INF && y2.i != INT64_MAX && (1.0 - ::exp(static_cast<double>(lp[y1.i]))) > kSworEps;
    const bool single = (1.0 - ::exp(static_cast<double>(lp[hub]))) <= kSworEps;
    const bool first_is_hub = y1.i == hub;
    const bool v2 = (first_is_hub ? v2_topk : true) && !single;
    tokens[row * 2] = first_is_hub ? hub : y1.i;
    tokens[row * 2 + 1] = v2 ? (first_is_hub ? y2.i : hub) : -1;
    valid[row * 2] = true;
    valid[row * 2 + 1] = v2;
    hub_out[row] = hub;
  }
}

__device__ void kseq_sums_d(const float* p, const float* q, double g, int64_t V, double* a, double* be) {
  double sa = 0.0, sb = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    sa += fmin(g * static_cast<double>(p[v]), static_cast<double>(q[v]));
    sb += fmin(static_cast<double>(p[v]), static_cast<double>(q[v]) / g);
  }
  *a = block_sum<double>(sa);
  *be = block_sum<double>(sb);
}

__global__ void kseq_gamma_kernel(const float* __restrict__ p, const float* __restrict__ q,  // [B, V]
                                  const int64_t* __restrict__ k,                             // [B]
                                  double* __restrict__ gamma, double* __restrict__ beta,     // [B]
                                  int64_t V) {
  const int64_t b = blockIdx.x;
  const int kk = static_cast<int>(k[b]);
  double a, be, hi = 1.0;
  kseq_sums_d(p + b * V, q + b * V, 1.0, V, &a, &be);
  if (kk > 1 && be < 1.0 - 1e-12 && a - 1.0 + ::pow(1.0 - be, kk) < 0.0) {  // p = q up to round-off: gamma = 1
    double lo = 1.0;
    hi = static_cast<double>(kk);
    for (int it = 0; it < 40; ++it) {
      const double mid = 0.5 * (lo + hi);
      kseq_sums_d(p + b * V, q + b * V, mid, V, &a, &be);
      if (a - 1.0 + ::pow(1.0 - be, kk) >= 0.0) hi = mid; else lo = mid;
    }
  }
  kseq_sums_d(p + b * V, q + b * V, hi, V, &a, &be);
  if (threadIdx.x == 0) {
    gamma[b] = hi;
    beta[b] = be;
  }
}

__device__ __forceinline__ double log1mexp(double a) {
  return a > -kLn2 ? ::log(-::expm1(a)) : ::log1p(-::exp(a));
}

// Stable Trunc(u, phit, Z) with its guards.
__device__ __forceinline__ double truncated_gumbel(double u, double phit, double z) {
  if (phit == -CUDART_INF) return -CUDART_INF;
  if (phit == z) return u;
  const double v = u - phit + log1mexp(fmin(phit - z, 0.0));
  return u - (fmax(v, 0.0) + ::log1p(::exp(-::fabs(v))));
}

// Per parent: its top-WSEL children by perturbed score (the only ones that can survive, since Trunc is monotone
// within a parent), truncated; then the global top-Wout by (psi desc, flattened index asc). The (WSEL+1)-th child by
// perturbed score certifies the cut: if its psi is not below the smallest selected psi by more than the formula's
// rounding (a psi tie, or Trunc flattened when Gamma << Z), the parent's psi is evaluated for every child instead.
__global__ void sbs_step_kernel(const float* __restrict__ logp,    // [B, Win, V]
                                const double* __restrict__ sigma,  // [B, Win]
                                const double* __restrict__ gam,    // [B, Win]
                                const bool* __restrict__ bvalid,   // [B, Win]
                                const double* __restrict__ noise,  // [B, Win, V] or nullptr: drawn (seed)
                                uint64_t seed,
                                double* __restrict__ cpsi,         // [B, C] scratch
                                int64_t* __restrict__ cidx,        // [B, C] scratch
                                double* __restrict__ cphi,         // [B, C] scratch
                                int64_t* __restrict__ parent_slot, int64_t* __restrict__ tokens,    // [B, Wout]
                                double* __restrict__ sigma_out, double* __restrict__ gamma_out,     // [B, Wout]
                                bool* __restrict__ valid,                                           // [B, Wout]
                                int64_t Win, int64_t V, int64_t WSEL, int64_t Wout) {
  __shared__ bool redo;
  const int64_t b = blockIdx.x;
  const int64_t C = Win * WSEL;
  const int64_t picks = WSEL < V ? WSEL + 1 : WSEL;
  for (int64_t k = 0; k < Win; ++k) {
    const bool live = bvalid[b * Win + k];
    const double sig = live ? sigma[b * Win + k] : 0.0, g = live ? gam[b * Win + k] : 0.0;
    const float* lp = logp + (b * Win + k) * V;
    const NoiseRow u = noise_row(noise, V, seed, kDraftNoise, b * Win + k);
    double prev_s = CUDART_INF, z = -CUDART_INF, min_sel = CUDART_INF, psi_extra = -CUDART_INF,
           phit_extra = 0.0;
    int64_t prev_i = -1;
    for (int64_t j = 0; j < picks; ++j) {
      const ArgBest best = next_in_race(lp, u, sig, V, prev_s, prev_i);
      if (j == 0) z = best.v;
      if (threadIdx.x == 0) {
        const bool ok = live && best.i != INT64_MAX;
        const double psi = ok ? truncated_gumbel(g, best.v, z) : -CUDART_INF;
        if (j < WSEL) {
          const int64_t slot = b * C + k * WSEL + j;
          cpsi[slot] = psi;
          cidx[slot] = k * V + (best.i == INT64_MAX ? 0 : best.i);
          cphi[slot] = ok ? sig + static_cast<double>(lp[best.i]) : -CUDART_INF;
          min_sel = fmin(min_sel, psi);
        } else {
          psi_extra = psi;
          phit_extra = best.v;
        }
      }
      prev_s = best.v;
      prev_i = best.i;
    }
    if (threadIdx.x == 0) {
      const double margin = 1e-9 * (1.0 + ::fabs(g) + ::fabs(z) + ::fabs(phit_extra));
      redo = live && psi_extra > -CUDART_INF && !(psi_extra < min_sel - margin);
    }
    __syncthreads();
    if (!redo) continue;
    // Fallback: the WSEL best children by (psi desc, index asc) over the whole row.
    double prev_p = CUDART_INF;
    int64_t prev_v = -1;
    for (int64_t j = 0; j < WSEL; ++j) {
      ArgBest best{-CUDART_INF, INT64_MAX};
      for_each_noise(u, V, [&](int64_t v, double uv) {
        const double psi = truncated_gumbel(g, (sig + static_cast<double>(lp[v])) + gumbel(uv), z);
        if (psi < prev_p || (psi == prev_p && v > prev_v)) best = pick(best, ArgBest{psi, v});
      });
      best = block_argbest(best);
      if (threadIdx.x == 0) {
        const bool ok = best.i != INT64_MAX;
        const int64_t slot = b * C + k * WSEL + j;
        cpsi[slot] = ok ? best.v : -CUDART_INF;
        cidx[slot] = k * V + (ok ? best.i : 0);
        cphi[slot] = ok ? sig + static_cast<double>(lp[best.i]) : -CUDART_INF;
      }
      prev_p = best.v;
      prev_v = best.i;
    }
  }
  __syncthreads();
  double prev_s = CUDART_INF;
  int64_t prev_i = -1;
  for (int64_t j = 0; j < Wout; ++j) {
    ArgBest best{-CUDART_INF, INT64_MAX};
    int64_t best_pos = -1;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double s = cpsi[b * C + c];
      const int64_t i = cidx[b * C + c];
      if (s < prev_s || (s == prev_s && i > prev_i)) best = pick(best, ArgBest{s, i});
    }
    best = block_argbest(best);
    if (threadIdx.x == 0) {
      const bool ok = best.v > -CUDART_INF && best.i != INT64_MAX;
      for (int64_t c = 0; c < C && ok && best_pos < 0; ++c)
        if (cidx[b * C + c] == best.i) best_pos = c;
      const int64_t o = b * Wout + j;
      parent_slot[o] = ok ? best.i / V : -1;
      tokens[o] = ok ? best.i % V : -1;
      sigma_out[o] = ok ? cphi[b * C + best_pos] : -CUDART_INF;
      gamma_out[o] = ok ? best.v : -CUDART_INF;
      valid[o] = ok;
    }
    prev_s = best.v;
    prev_i = best.i;
  }
}

}  // namespace cuda
}  // namespace specdec

using namespace specdec::cuda;

extern "C" int specdec_cuda_spechub_sample(const float* logp, const double* noise, uint64_t seed, int64_t* tokens,
                                           int64_t* hub, bool* valid, int64_t rows, int64_t V, void* stream) {
  if (rows == 0) return 0;
  spechub_sample_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logp, noise, seed, tokens, hub,
                                                                                 valid, V);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_kseq_gamma(const float* p, const float* q, const int64_t* k, double* gamma, double* beta,
                                       int64_t B, int64_t V, void* stream) {
  if (B == 0) return 0;
  kseq_gamma_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, q, k, gamma, beta, V);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_sbs_step(const float* logp, const double* sigma, const double* gamma, const bool* bvalid,
                                     const double* noise, uint64_t seed, double* cpsi, int64_t* cidx, double* cphi,
                                     int64_t* parent_slot, int64_t* tokens, double* sigma_out, double* gamma_out,
                                     bool* valid, int64_t B, int64_t Win, int64_t V, int64_t Wout, void* stream) {
  if (B == 0) return 0;
  const int64_t wsel = Wout < V ? Wout : V;
  sbs_step_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(logp, sigma, gamma, bvalid, noise, seed, cpsi,
                                                                        cidx, cphi, parent_slot, tokens, sigma_out,
                                                                        gamma_out, valid, Win, V, wsel, Wout);
  return static_cast<int>(cudaGetLastError());
}
