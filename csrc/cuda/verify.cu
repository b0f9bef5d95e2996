// CUDA kernels: verify_chain, verify_node, verify_tree (docs/methods.md). One block per batch row; the block
// strides over the vocabulary for every residual pass. The arithmetic mirrors the torch reference (fp32 residuals,
// division-free acceptance tests compared in float64) so identical noise gives identical decisions.
#include <cuda_runtime.h>

#include "common.cuh"
#include "launchers.h"

namespace specdec {
namespace cuda {

constexpr float kZeroMassTol = 1e-6f;  // zero-mass rule (docs/exactness.md), fp32
constexpr double kZeroMassTolF64 = 1e-12;  // zero-mass rule, fp64 (SpecHub's double plan)
enum Method : int { kRrs = 0, kRrsw = 1, kKseq = 2, kSpecHub = 3, kBlock = 4, kGds = 6 };

__device__ __forceinline__ float ratio_prob(float num, float den) {
  if (den > 0.0f) return fminf(fmaxf(num / den, 0.0f), 1.0f);
  return num > 0.0f ? 1.0f : 0.0f;
}

__device__ __forceinline__ double ratio_prob_d(double num, double den) {
  if (den > 0.0) return fmin(fmax(num / den, 0.0), 1.0);
  return num > 0.0 ? 1.0 : 0.0;
}

// One token's terms of SpecHub's transport plan, in double.
struct HubTerm {
  double qai, q1, a2;
};

__device__ __forceinline__ HubTerm hub_term(double pa, float pv, float qv, double rest) {
  const double p = pv, q = qv;
  const double qai = rest > 0.0 ? pa * p / rest : 0.0;
  const double q1 = q - fmin(p, q);
  return {qai, q1, fmin(qai, q1)};
}

__device__ __forceinline__ bool passes(double u, float den, float num) {
  return u * static_cast<double>(den) < static_cast<double>(num);
}

__device__ void copy_row(const float* src, float* dst, int64_t V) {
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) dst[v] = src[v];
  __syncthreads();
}

// r <- Norm[(r - scale * s)^+] in place, or unchanged when the mass is numerically zero.
__device__ void residual_inplace(float* r, const float* s, int64_t V) {
  float tot = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += fmaxf(r[v] - s[v], 0.0f);
  tot = block_sum<float>(tot);
  if (tot > kZeroMassTol) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) r[v] = fmaxf(r[v] - s[v], 0.0f) / tot;
  }
  __syncthreads();
}

__device__ void remove_and_renormalize(float* s, int64_t x, int64_t V) {
  if (threadIdx.x == 0) s[x] = 0.0f;
  __syncthreads();
  float tot = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += s[v];
  tot = block_sum<float>(tot);
  if (tot > 0.0f) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s[v] /= tot;
  }
  __syncthreads();
}

// Gumbel-max sample of Norm[(q - s)^+] (q itself when the mass is numerically zero).
__device__ int64_t sample_residual(const float* q, const float* s, const NoiseRow& noise, int64_t V) {
  float tot = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += fmaxf(q[v] - s[v], 0.0f);
  tot = block_sum<float>(tot);
  const bool use_q = tot <= kZeroMassTol;
  ArgBest best{-CUDART_INF, INT64_MAX};
  for_each_noise(noise, V, [&](int64_t v, double u) {
    const float r = use_q ? q[v] : fmaxf(q[v] - s[v], 0.0f) / tot;
    const double sc = (r > 0.0f ? ::log(static_cast<double>(r)) : -CUDART_INF) + gumbel(u);
    best = pick(best, ArgBest{sc, v});
  });
  return block_argbest(best).i;
}

__device__ void kseq_sums(const float* p, const float* q, double g, int64_t V, double* a, double* be) {
  double sa = 0.0, sb = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const double pv = p[v], qv = q[v];
    sa += fmin(g * pv, qv);
    sb += fmin(pv, qv / g);
  }
  *a = block_sum<double>(sa);
  *be = block_sum<double>(sb);
}

// K-SEQ: smallest g in [1, k] with h(g) >= 0 by 40 float64 bisection steps (upper bracket).
__device__ void kseq_gamma_row(const float* p, const float* q, int k, int64_t V, double* gamma, double* beta) {
  double a, be;
  kseq_sums(p, q, 1.0, V, &a, &be);
  // the rows' masses, summed in the order of be: p = q gives be == mass exactly
  double mp_sum = 0.0, mq_sum = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    mp_sum += static_cast<double>(p[v]);
    mq_sum += static_cast<double>(q[v]);
  }
  const double mass = fmax(block_sum<double>(mp_sum), block_sum<double>(mq_sum));
  double hi = 1.0;
  // p = q (be >= mass - 1e-12, reference KSEQ_EQUAL_TOL): gamma = 1
  if (k > 1 && be < mass - 1e-12 && a - 1.0 + ::pow(1.0 - be, k) < 0.0) {
    double lo = 1.0;
    hi = static_cast<double>(k);
    for (int it = 0; it < 40; ++it) {
      const double mid = 0.5 * (lo + hi);
      kseq_sums(p, q, mid, V, &a, &be);
      if (a - 1.0 + ::pow(1.0 - be, k) >= 0.0) hi = mid; else lo = mid;
    }
  }
  kseq_sums(p, q, hi, V, &a, &be);
  *gamma = hi;
  *beta = be;
}

// gds: zero the greedy candidates (every valid slot but `last`) in the row, then divide it by its sum; with a
// fallback, the row becomes the fallback when that sum is numerically zero.
__device__ void drop_greedy_and_normalize(float* row, const int64_t* cand, const bool* cvalid, int64_t K, int64_t last,
                                          const float* fallback, int64_t V) {
  if (threadIdx.x == 0)
    for (int64_t j = 0; j < K; ++j)
      if (cvalid[j] && j != last) row[cand[j]] = 0.0f;
  __syncthreads();
  float tot = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += row[v];
  tot = block_sum<float>(tot);
  const bool use_fallback = fallback != nullptr && !(tot > kZeroMassTol);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) row[v] = use_fallback ? fallback[v] : row[v] / tot;
  __syncthreads();
}

// One node: returns the accepted slot (-1 = none); the final residual is left normalized in r.
__device__ int64_t verify_node_row(const int64_t* cand,    // [K] tokens by slot
                                   const bool* cvalid,     // [K]
                                   int64_t K,
                                   const float* p,         // [V] draft law
                                   const float* q,         // [V] target law
                                   const NoiseRow& u,      // [K] acceptance uniforms by slot
                                   int64_t hub,
                                   float* r,               // [V] scratch -> final residual
                                   float* s,               // [V] scratch (rrsw, gds)
                                   float* ap,              // [K] accept_prob or nullptr
                                   int64_t V, int method) {
  int64_t chosen = -1;
  const bool analytic = ap != nullptr;
  copy_row(q, r, V);
  if (method == kRrs || method == kRrsw) {
    if (method == kRrsw) copy_row(p, s, V);
    for (int64_t j = 0; j < K && (chosen < 0 || analytic); ++j) {
      if (!cvalid[j]) continue;
      const int64_t x = cand[j];
      const float den = method == kRrsw ? s[x] : p[x];
      const float num = r[x];
      if (analytic && threadIdx.x == 0) ap[j] = ratio_prob(num, den);
      if (chosen < 0 && passes(u.at(j), den, num)) chosen = j;
      if (chosen < 0 || analytic) {
        __syncthreads();  // every thread has read r[x] / s[x] before they change
        if (method == kRrsw) {
          residual_inplace(r, s, V);
          remove_and_renormalize(s, x, V);
        } else {
          residual_inplace(r, p, V);
        }
      }
    }
  } else if (method == kGds) {
    // Greedy draft sampling: the last valid candidate was drawn from p without the others (the set D) and is tested
    // first against that law; each token of D then takes its share of the residual still untested.
    int64_t last = -1;
    for (int64_t j = 0; j < K; ++j)
      if (cvalid[j]) last = j;
    copy_row(p, s, V);
    drop_greedy_and_normalize(s, cand, cvalid, K, last, nullptr, V);
    const int64_t x = cand[last];
    const float den = s[x], num = q[x];
    if (analytic && threadIdx.x == 0) ap[last] = ratio_prob(num, den);
    if (passes(u.at(last), den, num)) chosen = last;
    residual_inplace(r, s, V);
    float left = 1.0f;
    for (int64_t j = 0; j < K; ++j) {
      if (!cvalid[j] || j == last) continue;
      const float rd = r[cand[j]];
      if (analytic && threadIdx.x == 0) ap[j] = ratio_prob(rd, left);
      if (chosen < 0 && passes(u.at(j), left, rd)) chosen = j;
      left = left - rd;
    }
    __syncthreads();  // every thread has read r before D leaves it
    drop_greedy_and_normalize(r, cand, cvalid, K, last, q, V);
  } else if (method == kKseq) {
    int n_valid = 0;
    for (int64_t j = 0; j < K; ++j) n_valid += cvalid[j];
    double g, be;
    kseq_gamma_row(p, q, n_valid, V, &g, &be);
    const float g32 = static_cast<float>(g);
    if (be > 0.0) {
      for (int64_t j = 0; j < K; ++j) {
        if (!cvalid[j]) continue;
        const int64_t x = cand[j];
        const float den = g32 * p[x], num = q[x];
        if (analytic && threadIdx.x == 0) ap[j] = ratio_prob(num, den);
        if (chosen < 0 && passes(u.at(j), den, num)) chosen = j;
      }
      const float c = static_cast<float>((1.0 - ::pow(1.0 - be, n_valid)) / be);
      float tot = 0.0f;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += fmaxf(q[v] - c * fminf(p[v], q[v] / g32), 0.0f);
      tot = block_sum<float>(tot);
      if (tot > kZeroMassTol) {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
          r[v] = fmaxf(q[v] - c * fminf(p[v], q[v] / g32), 0.0f) / tot;
      }
      __syncthreads();
    }
  } else {  // SpecHub
    const int64_t x0 = cand[0];
    if (K < 2 || !cvalid[1]) {  // a one-child tree node, or p(hub) ~ 1: a single-candidate SD node
      const float den = p[x0], num = q[x0];
      if (analytic && threadIdx.x == 0) ap[0] = ratio_prob(num, den);
      if (passes(u.at(0), den, num)) chosen = 0;
      residual_inplace(r, p, V);
    } else {
      // The plan in double: when p(a) ~ 1 the pairs (a, .) carry nearly all of the draft mass, and float rounding
      // of their terms would become the output law's error. Q(a, i) = p(a) p(i) / rest with rest = the non-hub
      // mass the sampler drew i from, not 1 - p(a) (docs/exactness.md). The residual alone is stored in float.
      const double pa = p[hub], qa = q[hub];
      double rest = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) rest += v != hub ? static_cast<double>(p[v]) : 0.0;
      rest = block_sum<double>(rest);
      double s_ai = 0.0, s_ia = 0.0, tot = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        if (v == hub) continue;
        const HubTerm t = hub_term(pa, p[v], q[v], rest);
        s_ia += static_cast<double>(p[v]) - fmin(static_cast<double>(p[v]), static_cast<double>(q[v]));
        s_ai += t.qai - t.a2;
        tot += t.q1 - t.a2;
      }
      s_ai = block_sum<double>(s_ai);
      s_ia = block_sum<double>(s_ia);
      const double a3 = fmin(qa, s_ai), a4 = fmin(qa - a3, s_ia);
      const double fin_a = fmax(qa - a3 - a4, 0.0);
      tot = block_sum<double>(tot) + fin_a;
      if (tot > kZeroMassTolF64) {  // the double plan's leftover is real, not float round-off
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
          const HubTerm t = hub_term(pa, p[v], q[v], rest);
          r[v] = static_cast<float>((v == hub ? fin_a : t.q1 - t.a2) / tot);
        }
      }
      __syncthreads();
      double den0, num0, den1, num1;
      if (x0 == hub) {  // pair type (a, i): the non-hub token (slot 1) is tested first
        const int64_t i = cand[1];
        const HubTerm t = hub_term(pa, p[i], q[i], rest);
        den1 = t.qai;
        num1 = t.q1;
        den0 = s_ai;
        num0 = s_ai > 0.0 ? qa : 0.0;  // a hub test with no leftover is never reached
      } else {
        den0 = p[x0];
        num0 = q[x0];
        den1 = s_ia;
        num1 = s_ia > 0.0 ? qa - a3 : 0.0;
      }
      if (analytic && threadIdx.x == 0) {
        ap[0] = static_cast<float>(ratio_prob_d(num0, den0));
        ap[1] = static_cast<float>(ratio_prob_d(num1, den1));
      }
      const bool ok0 = u.at(0) * den0 < num0, ok1 = u.at(1) * den1 < num1;
      chosen = x0 == hub ? (ok1 ? 1 : (ok0 ? 0 : -1)) : (ok0 ? 0 : (ok1 ? 1 : -1));
    }
  }
  __syncthreads();
  return chosen;
}

__device__ bool is_eos(int64_t x, const int64_t* eos, int64_t n_eos) {
  for (int64_t e = 0; e < n_eos; ++e)
    if (x == eos[e]) return true;
  return false;
}

__global__ void verify_chain_kernel(const int64_t* __restrict__ draft,   // [B, L]
                                    const float* __restrict__ p,         // [B, L, V] (unused when greedy)
                                    const float* __restrict__ q,         // [B, L+1, V]
                                    const int64_t* __restrict__ lengths, // [B]
                                    const double* __restrict__ accept_u, // [B, L] or nullptr: drawn (seed)
                                    const double* __restrict__ fin,      // [B, V] or nullptr: drawn (seed)
                                    uint64_t seed,
                                    const int64_t* __restrict__ eos, int64_t n_eos,
                                    int64_t* __restrict__ n_acc,         // [B]
                                    int64_t* __restrict__ next,          // [B]
                                    int64_t L, int64_t V, bool greedy,
                                    double leniency) {  // l >= 1: accept iff U p(x) < l q(x) (CS Drafting)
  const int64_t b = blockIdx.x;
  const NoiseRow ua = noise_row(accept_u, L, seed, kAcceptNoise, b), fz = noise_row(fin, V, seed, kFinalNoise, b);
  int64_t j = 0;
  int state = 0;  // 0 running, 1 rejected at j, 2 stopped at EOS
  while (state == 0 && j < lengths[b]) {
    const int64_t x = draft[b * L + j];
    const float* qrow = q + (b * (L + 1) + j) * V;
    // greedy with l = 1: p is a placeholder, never read
    const double lqx = leniency * static_cast<double>(qrow[x]);
    const bool ok = greedy ? (x == row_argmax<true>(qrow, V) ||
                              (leniency > 1.0 && static_cast<double>(p[(b * L + j) * V + x]) < lqx))
                           : ua.at(j) * static_cast<double>(p[(b * L + j) * V + x]) < lqx;
    if (ok) {
      ++j;
      if (is_eos(x, eos, n_eos)) state = 2;
    } else {
      state = 1;
    }
  }
  const float* qrow = q + (b * (L + 1) + j) * V;
  int64_t out;
  if (state == 2) out = -1;
  else if (greedy) out = row_argmax<true>(qrow, V);
  else if (state == 1) out = sample_residual(qrow, p + (b * L + j) * V, fz, V);
  else out = row_argmax<false>(qrow, fz, V);
  if (threadIdx.x == 0) {
    n_acc[b] = j;
    next[b] = out;
  }
}

// E = min(p, l q) + r rho per row (CS Drafting's emission law; rho = res(q, p), q under the zero-mass rule):
// l rounded to float like the reference, both sums accumulated in double.
__global__ void emission_law_kernel(const float* __restrict__ p, const float* __restrict__ q,  // [R, V]
                                    float* __restrict__ out,                                   // [R, V]
                                    int64_t V, double leniency) {
  const float* pr = p + blockIdx.x * V;
  const float* qr = q + blockIdx.x * V;
  float* o = out + blockIdx.x * V;
  const float l = static_cast<float>(leniency);
  double rej = 0.0, mass = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    rej += static_cast<double>(fmaxf(__fsub_rn(pr[v], __fmul_rn(l, qr[v])), 0.0f));
    mass += static_cast<double>(fmaxf(qr[v] - pr[v], 0.0f));
  }
  const float r = static_cast<float>(block_sum<double>(rej));
  const float tot = static_cast<float>(block_sum<double>(mass));
  const bool use_q = tot <= kZeroMassTol;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float lq = __fmul_rn(l, qr[v]);
    const float rho = use_q ? qr[v] : fmaxf(qr[v] - pr[v], 0.0f) / tot;
    o[v] = __fadd_rn(fminf(pr[v], lq), __fmul_rn(r, rho));
  }
}

__global__ void verify_node_kernel(const int64_t* __restrict__ cand, const bool* __restrict__ cvalid,  // [B, K]
                                   const float* __restrict__ p, const float* __restrict__ q,           // [B, V]
                                   const double* __restrict__ accept_u,                                // [B, K] or null
                                   const double* __restrict__ fin,                                     // [B, V] or null
                                   uint64_t seed,                                                      // null: drawn
                                   const int64_t* __restrict__ hub,                                    // [B]
                                   float* __restrict__ r, float* __restrict__ s,                       // [B, V]
                                   float* __restrict__ ap,                                             // [B, K] or null
                                   int64_t* __restrict__ slot, int64_t* __restrict__ token,            // [B]
                                   int64_t K, int64_t V, int method) {
  const int64_t b = blockIdx.x;
  const NoiseRow ua = noise_row(accept_u, K, seed, kAcceptNoise, b), fz = noise_row(fin, V, seed, kFinalNoise, b);
  const int64_t chosen = verify_node_row(cand + b * K, cvalid + b * K, K, p + b * V, q + b * V, ua, hub[b],
                                         r + b * V, s + b * V, ap ? ap + b * K : nullptr, V, method);
  const int64_t tok = chosen >= 0 ? cand[b * K + chosen] : row_argmax<false>(r + b * V, fz, V);
  if (threadIdx.x == 0) {
    slot[b] = chosen;
    token[b] = tok;
  }
}

// w_i of block verification along the chain root = chain[-1 slot], chain[0..i) (every thread computes the same
// doubles: chains are a few nodes long, so recomputing the product beats a scratch row).
__device__ double block_weight(const int64_t* tokens, const int64_t* chain, int64_t i, const float* p, const float* q,
                               int64_t V) {
  double w = 1.0;
  int64_t prev = 0;
  for (int64_t d = 0; d < i; ++d) {
    const int64_t x = tokens[chain[d]];
    w = fmin(w * static_cast<double>(q[prev * V + x]) / static_cast<double>(p[prev * V + x]), 1.0);
    prev = chain[d];
  }
  return w;
}

__device__ double block_excess_sum(double w, const float* p, const float* q, int64_t V) {
  double tot = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    tot += fmax(w * static_cast<double>(q[v]) - static_cast<double>(p[v]), 0.0);
  return block_sum<double>(tot);
}

// Block verification of row b's chain (docs/methods.md, Block verification): the deepest level i whose test passes is
// tau (level i < len: U_i (S_i + 1 - w_i) < S_i with S_i = sum (w_i q_i - p_i)^+; the last: U_len < w_len), the next
// token from q after the chain when tau = len, else from Norm[(w_tau q - p)^+] (q when its mass is <= 1e-12).
__device__ void block_walk(const int64_t* tokens, const int64_t* parent, const bool* valid, const float* p,
                           const float* q, const NoiseRow& fz, uint64_t seed, const double* accept_u, int64_t KU,
                           const int64_t* eos, int64_t n_eos, int64_t* chain, int64_t* acc, int64_t* rank,
                           int64_t* n_acc, int64_t* next, int64_t b, int64_t N, int64_t V, int64_t L) {
  __shared__ int64_t len;
  if (threadIdx.x == 0) {  // the chain: each node's first child (the op admits chains only)
    int64_t cur = 0, m = 0;
    for (int64_t n = 1; n < N; ++n) {
      if (valid[n] && parent[n] == cur) {
        chain[m++] = n;
        cur = n;
      }
    }
    len = m;
  }
  __syncthreads();
  if (len > L) {  // a chain longer than the outputs (a wrong max_depth): the row reports n_accepted = -1
    if (threadIdx.x == 0) {
      *n_acc = -1;
      *next = -1;
    }
    return;
  }
  int64_t tau = 0;
  for (int64_t i = len; i >= 1 && tau == 0; --i) {
    const int64_t node = chain[i - 1];
    const double u = noise_row(accept_u, KU, seed, kAcceptNoise, b * N + node).at(0);
    const double w = block_weight(tokens, chain, i, p, q, V);
    bool ok;
    if (i == len) {
      ok = u * 1.0 < w;
    } else {
      const double sum = block_excess_sum(w, p + node * V, q + node * V, V);
      ok = u * (sum + (1.0 - w)) < sum;
    }
    if (ok) tau = i;
  }
  const int64_t node = tau == 0 ? 0 : chain[tau - 1];
  int64_t out;
  if (tau == len) {
    out = row_argmax<false>(q + node * V, fz, V);
  } else {
    const double w = block_weight(tokens, chain, tau, p, q, V);
    const float* pn = p + node * V;
    const float* qn = q + node * V;
    const double tot = block_excess_sum(w, pn, qn, V);
    ArgBest best{-CUDART_INF, INT64_MAX};  // Gumbel-max over the law in double, as the reference samples it
    for_each_noise(fz, V, [&](int64_t v, double u) {
      const double m = tot <= kZeroMassTolF64
                           ? static_cast<double>(qn[v])
                           : fmax(w * static_cast<double>(qn[v]) - static_cast<double>(pn[v]), 0.0) / tot;
      best = pick(best, ArgBest{(m > 0.0 ? ::log(m) : -CUDART_INF) + gumbel(u), v});
    });
    best = block_argbest(best);
    out = best.i == INT64_MAX ? 0 : best.i;
  }
  if (threadIdx.x == 0) {
    for (int64_t d = 0; d < tau; ++d) {
      if (is_eos(tokens[chain[d]], eos, n_eos)) {  // an accepted EOS ends the row
        tau = d + 1;
        out = -1;
        break;
      }
    }
    for (int64_t d = 0; d < L; ++d) {
      acc[d] = d < tau ? chain[d] : -1;
      rank[d] = d < tau ? 0 : -1;
    }
    *n_acc = tau;
    *next = out;
  }
}

// Traversal verification of one row's tree per block (docs/methods.md, Traversal verification). The path from the
// root holds at each depth its node, (a, den, num) and its target / draft laws in double; thread 0 walks, the block
// strides over the vocabulary for the row copies, the parent updates and the final sample.
__global__ void verify_traversal_kernel(const int64_t* __restrict__ tokens,
                                        const int64_t* __restrict__ parent,  // [B, N]
                                        const bool* __restrict__ valid,      // [B, N]
                                        const float* __restrict__ p, const float* __restrict__ q,  // [B, N, V]
                                        const double* __restrict__ accept_u,  // [B, N, KU] or null (drawn)
                                        const double* __restrict__ fin,       // [B, V] or null (drawn)
                                        uint64_t seed, const int64_t* __restrict__ eos, int64_t n_eos,
                                        int* __restrict__ removed,        // [B, N] zeroed: removed children per node
                                        int64_t* __restrict__ lv_node,    // [B, L + 1]
                                        double* __restrict__ lv,          // [B, L + 1, 3]: a, den, num
                                        double* __restrict__ r, double* __restrict__ d,  // [B, L + 1, V]
                                        int64_t* __restrict__ acc, int64_t* __restrict__ rank,  // [B, L]
                                        int64_t* __restrict__ n_acc, int64_t* __restrict__ next,  // [B]
                                        int64_t N, int64_t V, int64_t KU, int64_t L, bool swor) {
  const int64_t b = blockIdx.x;
  const NoiseRow fz = noise_row(fin, V, seed, kFinalNoise, b);
  const int64_t* tok = tokens + b * N;
  const int64_t* par = parent + b * N;
  const bool* val = valid + b * N;
  int* rem = removed + b * N;
  int64_t* path = lv_node + b * (L + 1);
  double* st = lv + b * (L + 1) * 3;
  double* rr = r + b * (L + 1) * V;
  double* dd = d + b * (L + 1) * V;
  const float* pr = p + b * N * V;
  const float* qr = q + b * N * V;
  __shared__ int64_t depth, node, child;
  __shared__ int verdict;  // 0 descend/test, 1 accepted, 2 rejected
  __shared__ bool too_deep;  // a path longer than L (a wrong max_depth): the row reports n_accepted = -1
  if (threadIdx.x == 0) {
    too_deep = false;
    depth = 0;
    path[0] = 0;
    st[0] = 1.0;
    st[1] = 1.0;
    st[2] = 1.0;
  }
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    rr[v] = static_cast<double>(qr[v]);
    dd[v] = static_cast<double>(pr[v]);
  }
  __syncthreads();
  while (true) {
    // descend to the first child left (the removed children of a node are always its first ones)
    while (true) {
      if (threadIdx.x == 0) {
        node = path[depth];
        child = -1;
        int seen = 0;
        for (int64_t m = 1; m < N && child < 0; ++m) {
          if (val[m] && par[m] == node) {
            if (seen == rem[node]) child = m;
            ++seen;
          }
        }
        if (child >= 0 && depth + 1 > L) {
          too_deep = true;
          child = -1;
        }
        if (child >= 0) {
          const int64_t x = tok[child];
          const double rx = rr[depth * V + x], dx = dd[depth * V + x];
          const double a = dx > 0.0 ? fmin(st[depth * 3] * rx / dx, 1.0) : 0.0;
          ++depth;
          path[depth] = child;
          st[depth * 3] = a;
          st[depth * 3 + 1] = 1.0;
          st[depth * 3 + 2] = a;
        }
      }
      __syncthreads();
      if (child < 0) break;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        rr[depth * V + v] = static_cast<double>(qr[child * V + v]);
        dd[depth * V + v] = static_cast<double>(pr[child * V + v]);
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const double u = depth == 0 ? 0.0 : noise_row(accept_u, KU, seed, kAcceptNoise, b * N + node).at(0);
      verdict = (too_deep || depth == 0 || u * st[depth * 3 + 1] < st[depth * 3 + 2]) ? 1 : 2;
    }
    __syncthreads();
    if (verdict == 1) break;
    // rejected: the node leaves the tree, its parent is updated
    const int64_t up = depth - 1;
    const double a_p = st[up * 3];
    double mass = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mass += fmax(a_p * rr[up * V + v] - dd[up * V + v], 0.0);
    mass = block_sum<double>(mass);
    if (mass > kZeroMassTolF64) {
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
        rr[up * V + v] = fmax(a_p * rr[up * V + v] - dd[up * V + v], 0.0) / mass;
    }
    __syncthreads();
    if (swor) {  // the rejected token leaves the law the next sibling was drawn from
      if (threadIdx.x == 0) dd[up * V + tok[node]] = 0.0;
      __syncthreads();
      double tot = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) tot += dd[up * V + v];
      tot = block_sum<double>(tot);
      if (tot > 0.0)
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) dd[up * V + v] = dd[up * V + v] / tot;
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const double den = mass + (1.0 - a_p);
      st[up * 3] = den > 0.0 ? mass / den : a_p;
      st[up * 3 + 1] = den;
      st[up * 3 + 2] = mass;
      ++rem[path[up]];
      depth = up;
    }
    __syncthreads();
  }
  // the token after the accepted node: a Gumbel-max sample of its target law, in double
  const double* law = rr + depth * V;
  ArgBest best{-CUDART_INF, INT64_MAX};
  for_each_noise(fz, V, [&](int64_t v, double u) {
    best = pick(best, ArgBest{(law[v] > 0.0 ? ::log(law[v]) : -CUDART_INF) + gumbel(u), v});
  });
  best = block_argbest(best);
  if (threadIdx.x == 0) {
    int64_t out = best.i == INT64_MAX ? 0 : best.i, kept = depth;
    for (int64_t k = 1; k <= depth; ++k) {
      if (is_eos(tok[path[k]], eos, n_eos)) {  // an accepted EOS ends the row
        kept = k;
        out = -1;
        break;
      }
    }
    for (int64_t k = 0; k < L; ++k) {
      acc[b * L + k] = k < kept ? path[k + 1] : -1;
      rank[b * L + k] = k < kept ? rem[path[k]] : -1;
    }
    n_acc[b] = too_deep ? -1 : kept;
    next[b] = out;
  }
}

// Tree walk; candidates of a step = valid nodes whose parent is alive (one node, or for SpecTr every
// alive chain node carrying the accepted token).
__global__ void verify_tree_kernel(const int64_t* __restrict__ tokens, const int64_t* __restrict__ parent,  // [B, N]
                                   const bool* __restrict__ valid,                                          // [B, N]
                                   const float* __restrict__ p, const float* __restrict__ q,                // [B,N,V]
                                   const int64_t* __restrict__ hub,                                         // [B, N]
                                   const double* __restrict__ accept_u,                          // [B,N,KU] or null
                                   const double* __restrict__ fin,                               // [B, V] or null
                                   uint64_t seed,                                                // null: drawn
                                   const int64_t* __restrict__ eos, int64_t n_eos,
                                   int* __restrict__ alive,                                                 // [B, N]
                                   int64_t* __restrict__ ctok, int64_t* __restrict__ cnode,                 // [B, KC]
                                   const bool* __restrict__ ones,                                           // [KC]
                                   float* __restrict__ r, float* __restrict__ s,                            // [B, V]
                                   int64_t* __restrict__ acc, int64_t* __restrict__ rank,                   // [B, L]
                                   int64_t* __restrict__ n_acc, int64_t* __restrict__ next,                 // [B]
                                   int64_t N, int64_t V, int64_t KU, int64_t KC, int64_t L, int method,
                                   bool kseq, bool greedy) {
  const int64_t b = blockIdx.x;
  const NoiseRow fz = noise_row(fin, V, seed, kFinalNoise, b);
  if (method == kBlock && !greedy) {
    block_walk(tokens + b * N, parent + b * N, valid + b * N, p + b * N * V, q + b * N * V, fz, seed, accept_u, KU,
               eos, n_eos, cnode + b * KC, acc + b * L, rank + b * L, n_acc + b, next + b, b, N, V, L);
    return;
  }
  __shared__ int64_t cnt;
  int gen = 0;
  if (threadIdx.x == 0) alive[b * N] = 0;
  int64_t rep = 0, depth = 0, last = 0, out = -1;
  int state = 0;
  while (state == 0) {
    __syncthreads();
    if (threadIdx.x == 0) {
      cnt = 0;
      for (int64_t n = 1; n < N; ++n) {
        if (valid[b * N + n] && alive[b * N + parent[b * N + n]] == gen) {
          ctok[b * KC + cnt] = tokens[b * N + n];
          cnode[b * KC + cnt] = n;
          ++cnt;
        }
      }
    }
    __syncthreads();
    const float* qrow = q + (b * N + rep) * V;
    int64_t chosen = -1;
    if (cnt == 0) {
      out = greedy ? row_argmax<true>(qrow, V) : row_argmax<false>(qrow, fz, V);
      state = 1;
    } else if (greedy) {
      const int64_t target = row_argmax<true>(qrow, V);
      for (int64_t j = 0; j < cnt && chosen < 0; ++j)
        if (ctok[b * KC + j] == target) chosen = j;
      if (chosen < 0) {
        out = target;
        state = 1;
      }
    } else {
      // acceptance uniforms of the node's candidates: row b * N + rep, one element per rank
      const NoiseRow ua = noise_row(accept_u, KU, seed, kAcceptNoise, b * N + rep);
      chosen = verify_node_row(ctok + b * KC, ones, cnt, p + (b * N + rep) * V, qrow, ua, hub[b * N + rep], r + b * V,
                               s + b * V, nullptr, V, method);
      if (chosen < 0) {
        out = row_argmax<false>(r + b * V, fz, V);
        state = 1;
      }
    }
    if (chosen >= 0) {
      const int64_t child = cnode[b * KC + chosen], tok = ctok[b * KC + chosen];
      if (threadIdx.x == 0) rank[b * L + depth] = chosen;
      ++depth;
      last = child;
      if (is_eos(tok, eos, n_eos)) state = 2;
      ++gen;
      rep = child;
      __syncthreads();
      if (kseq) {
        for (int64_t j = 0; j < cnt; ++j) {
          if (ctok[b * KC + j] == tok) {
            const int64_t node = cnode[b * KC + j];
            rep = node < rep ? node : rep;
            if (threadIdx.x == 0) alive[b * N + node] = gen;
          }
        }
      } else if (threadIdx.x == 0) {
        alive[b * N + child] = gen;
      }
    }
  }
  if (threadIdx.x == 0) {
    int64_t node = last;
    for (int64_t d = depth - 1; d >= 0; --d) {  // parent-consistent path from the last accepted node
      acc[b * L + d] = node;
      node = parent[b * N + node];
    }
    n_acc[b] = depth;
    next[b] = out;
  }
}

}  // namespace cuda
}  // namespace specdec

using namespace specdec::cuda;

extern "C" int specdec_cuda_verify_chain(const int64_t* draft, const float* p, const float* q, const int64_t* lengths,
                                         const double* accept_u, const double* fin, uint64_t seed, const int64_t* eos,
                                         int64_t n_eos, int64_t* n_acc, int64_t* next, int64_t B, int64_t L, int64_t V,
                                         bool greedy, double leniency, void* stream) {
  if (B == 0) return 0;
  verify_chain_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      draft, p, q, lengths, accept_u, fin, seed, eos, n_eos, n_acc, next, L, V, greedy, leniency);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_emission_law(const float* p, const float* q, float* out, int64_t rows, int64_t V,
                                         double leniency, void* stream) {
  if (rows == 0 || V == 0) return 0;
  emission_law_kernel<<<rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, q, out, V, leniency);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_verify_node(const int64_t* cand, const bool* cvalid, const float* p, const float* q,
                                        const double* accept_u, const double* fin, uint64_t seed, const int64_t* hub,
                                        float* r, float* s, float* ap, int64_t* slot, int64_t* token, int64_t B,
                                        int64_t K, int64_t V, int method, void* stream) {
  if (B == 0) return 0;
  verify_node_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(cand, cvalid, p, q, accept_u, fin, seed,
                                                                           hub, r, s, ap, slot, token, K, V, method);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_verify_tree(const int64_t* tokens, const int64_t* parent, const bool* valid,
                                        const float* p, const float* q, const int64_t* hub, const double* accept_u,
                                        const double* fin, uint64_t seed, const int64_t* eos, int64_t n_eos, int* alive,
                                        int64_t* ctok, int64_t* cnode, const bool* ones, float* r, float* s,
                                        int64_t* acc, int64_t* rank, int64_t* n_acc, int64_t* next, int64_t B,
                                        int64_t N, int64_t V, int64_t KU, int64_t KC, int64_t L, int method, bool kseq,
                                        bool greedy, void* stream) {
  if (B == 0) return 0;
  verify_tree_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, parent, valid, p, q, hub, accept_u, fin, seed, eos, n_eos, alive, ctok, cnode, ones, r, s, acc, rank,
      n_acc, next, N, V, KU, KC, L, method, kseq, greedy);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int specdec_cuda_verify_traversal(const int64_t* tokens, const int64_t* parent, const bool* valid,
                                             const float* p, const float* q, const double* accept_u, const double* fin,
                                             uint64_t seed, const int64_t* eos, int64_t n_eos, int* removed,
                                             int64_t* lv_node, double* lv, double* r, double* d, int64_t* acc,
                                             int64_t* rank, int64_t* n_acc, int64_t* next, int64_t B, int64_t N,
                                             int64_t V, int64_t KU, int64_t L, bool swor, void* stream) {
  if (B == 0) return 0;
  verify_traversal_kernel<<<B, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      tokens, parent, valid, p, q, accept_u, fin, seed, eos, n_eos, removed, lv_node, lv, r, d, acc, rank, n_acc,
      next, N, V, KU, L, swor);
  return static_cast<int>(cudaGetLastError());
}
