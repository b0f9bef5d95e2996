// Verification kernels (docs/methods.md, docs/exactness.md): one batch row per call, raw pointers + sizes.
//
// S is the compute type of the probabilities (float, or double in fp64 oracle mode) like the reference's `cd`.
// Acceptance tests are division-free and compared in double: accept x iff U * p(x) < q(x). Residuals follow the
// zero-mass rule (docs/exactness.md), and every sample is a Gumbel race over log(probs) with the final noise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "specdec/common.h"
#include "specdec/sampling.h"

namespace specdec {

template <typename S>
constexpr double zero_mass_tol() {
  return sizeof(S) == 8 ? 1e-12 : 1e-6;
}

// Gumbel-max sample of a probability row: argmax_v log((double)probs[v]) + G(fin[v]); zero entries never win.
template <typename S>
int64_t sample_probs(const S* probs, const double* fin, int64_t vocab) {
  return gumbel_argmax(
      vocab, fin, [probs](int64_t v) { return ::log(static_cast<double>(probs[v])); },
      [probs](int64_t v) { return log_upper(probs[v]); });
}

// sample_probs over the m entries ids[0..m) (ascending) where probs has mass: the same scores, bounds and order as
// the dense race, whose other entries (log 0 = -inf) never win, so the same winner; m = 0 returns 0 like it.
template <typename S>
int64_t sample_probs_sparse(const S* probs, const double* fin, const int64_t* ids, int64_t m) {
  if (m == 0) return 0;
  int64_t best_i = ids[0];
  double best = ::log(static_cast<double>(probs[best_i])) + gumbel(fin[best_i]);
  for (int64_t t = 1; t < m; ++t) {
    const int64_t v = ids[t];
    if (log_upper(probs[v]) + gumbel_upper(fin[v]) < best - race_margin(best)) continue;
    const double total = ::log(static_cast<double>(probs[v])) + gumbel(fin[v]);
    if (total > best) {
      best = total;
      best_i = v;
    }
  }
  return best_i;
}

// The uniforms of one row's final sample: the caller's [V] (u set), or row `row` of the call's Philox stream
// (seed, kFinalNoise), drawn only at the entries where the law being sampled has mass. Top-k and top-p laws, and
// their residuals, hold a few of the V tokens, so most of the stream is never needed; every drawn entry gets the
// uniform the full stream would give it, so the sample is the same.
struct FinalNoise {
  const double* u = nullptr;
  uint64_t seed = 0, row = 0;
};

template <typename S>
int64_t sample_final(const S* probs, int64_t vocab, const FinalNoise& f) {
  if (f.u != nullptr) return sample_probs(probs, f.u, vocab);
  // scratch kept by the thread across calls: sizing two V-long buffers per call would clear them every time
  thread_local std::vector<double> buf;
  thread_local std::vector<int64_t> idx;
  if (static_cast<int64_t>(buf.size()) < vocab) buf.resize(vocab);
  const int64_t m = philox_fill_where(buf.data(), vocab, f.seed, kFinalNoise, f.row, idx, false,
                                      [probs](int64_t v) { return probs[v] > S(0); });
  return m < 0 ? sample_probs(probs, buf.data(), vocab) : sample_probs_sparse(probs, buf.data(), idx.data(), m);
}

// First maximum of a row (greedy mode; ties -> lowest id like torch.argmax): a vectorised max, then the first
// chunk that holds it.
template <typename S>
int64_t argmax_row(const S* x, int64_t vocab) {
  S mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < vocab; ++v) mx = x[v] > mx ? x[v] : mx;
  return first_index_of(vocab, mx, [x](int64_t v) { return x[v]; });
}

// sum_v x[v] accumulated in double (vectorised; the order differs from torch's fp32 cascade sum by a few ulps).
template <typename S>
double sum_row(const S* x, int64_t vocab) {
  double tot = 0.0;
#pragma omp simd reduction(+ : tot)
  for (int64_t v = 0; v < vocab; ++v) tot += static_cast<double>(x[v]);
  return tot;
}

// res(r, s) = Norm[(r - s)^+] written to out, or r itself when the mass is <= the zero-mass tolerance.
template <typename S>
void residual_row(const S* r, const S* s, int64_t vocab, S* out) {
  double tot = 0.0;
#pragma omp simd reduction(+ : tot)
  for (int64_t v = 0; v < vocab; ++v) {
    const S m = r[v] - s[v];
    const S o = m > S(0) ? m : S(0);
    out[v] = o;
    tot += static_cast<double>(o);
  }
  const S tot_s = static_cast<S>(tot);
  if (tot_s <= static_cast<S>(zero_mass_tol<S>())) {
    for (int64_t v = 0; v < vocab; ++v) out[v] = r[v];
    return;
  }
  for (int64_t v = 0; v < vocab; ++v) out[v] = out[v] / tot_s;
}

// Law of the token a lenient review emits (CS Drafting, spec section 6.4), written to out:
// E = min(p, l q) + r rho with r = sum_v (p(v) - l q(v))^+ and rho = res(q, p) (q under the zero-mass rule).
// l is rounded to S like the reference; both sums are accumulated in double.
template <typename S>
void emission_law_row(const S* p, const S* q, int64_t vocab, double leniency, S* out) {
  const S l = static_cast<S>(leniency);
  double rejected = 0.0, mass = 0.0;
#pragma omp simd reduction(+ : rejected, mass)
  for (int64_t v = 0; v < vocab; ++v) {
    const S d = p[v] - l * q[v];
    const S e = q[v] - p[v];
    rejected += static_cast<double>(d > S(0) ? d : S(0));
    mass += static_cast<double>(e > S(0) ? e : S(0));
  }
  const S r = static_cast<S>(rejected), m = static_cast<S>(mass);
  const bool use_q = m <= static_cast<S>(zero_mass_tol<S>());
  for (int64_t v = 0; v < vocab; ++v) {
    const S lq = l * q[v];
    const S e = q[v] - p[v];
    const S rho = use_q ? q[v] : (e > S(0) ? e : S(0)) / m;
    out[v] = (p[v] < lq ? p[v] : lq) + r * rho;
  }
}

inline bool is_eos(int64_t x, const int64_t* eos, int64_t n_eos) {
  for (int64_t i = 0; i < n_eos; ++i)
    if (eos[i] == x) return true;
  return false;
}

// Chain speculative sampling of one row (greedy mode: accept iff x == argmax q).
// Returns n_accepted and writes the correction / bonus token (-1 if the row stopped after an accepted EOS).
// leniency l >= 1 (CS Drafting's inner reviews): accept iff U * p(x) < l * q(x), l * q(x) in double; greedy with
// l > 1 also accepts x when p(x) < l * q(x) (p and q are then probability rows).
template <typename S>
int64_t verify_chain_row(const int64_t* draft,    // [L]
                         const S* p,              // [L, V] draft laws (unused when greedy and l = 1, may be null)
                         const S* q,              // [L + 1, V] target laws (logits are fine when greedy, l = 1)
                         int64_t len,             // verify draft[0:len]
                         const double* accept_u,  // [L] uniforms in [0, 1)
                         const FinalNoise& fin,   // uniforms in (0, 1) for the final sample
                         bool greedy, const int64_t* eos, int64_t n_eos, int64_t vocab,
                         S* scratch,  // [V]
                         int64_t* next_token, double leniency) {
  for (int64_t j = 0; j < len; ++j) {
    const int64_t x = draft[j];
    const S* qj = q + j * vocab;
    bool ok;
    if (greedy) {
      ok = x == argmax_row(qj, vocab);
      if (!ok && leniency > 1.0)
        ok = static_cast<double>(p[j * vocab + x]) < leniency * static_cast<double>(qj[x]);
    } else {
      const S* pj = p + j * vocab;
      ok = accept_u[j] * static_cast<double>(pj[x]) < leniency * static_cast<double>(qj[x]);
    }
    if (!ok) {
      if (greedy) {
        *next_token = argmax_row(qj, vocab);
      } else {
        residual_row(qj, p + j * vocab, vocab, scratch);
        *next_token = sample_final(scratch, vocab, fin);
      }
      return j;
    }
    if (is_eos(x, eos, n_eos)) {
      *next_token = -1;
      return j + 1;
    }
  }
  const S* qb = q + len * vocab;
  *next_token = greedy ? argmax_row(qb, vocab) : sample_final(qb, vocab, fin);
  return len;
}

// ---- node verifiers (docs/methods.md) ----

// kBlock and kTraversal(W) judge whole paths (block and traversal verification), not one node: verify_tree_row runs
// them on their own.
enum class Method { kSD, kRRS, kRRSw, kKSeq, kSpecHub, kGDS, kBlock, kTraversal, kTraversalW };

inline bool parse_method(const std::string& name, Method* out) {
  if (name == "sd") *out = Method::kSD;
  else if (name == "rrs") *out = Method::kRRS;
  else if (name == "rrsw") *out = Method::kRRSw;
  else if (name == "kseq") *out = Method::kKSeq;
  else if (name == "spechub") *out = Method::kSpecHub;
  else if (name == "gds") *out = Method::kGDS;
  else if (name == "block") *out = Method::kBlock;
  else if (name == "traversal") *out = Method::kTraversal;
  else if (name == "traversalw") *out = Method::kTraversalW;
  else return false;
  return true;
}

// One acceptance test of a node: accept candidate `slot` (position in the node's candidate list) iff
// U[slot] * den < num, compared in double. den/num carry the reference's compute-type rounding.
template <typename S>
struct NodeTest {
  int64_t slot;
  double den, num;  // S values, or SpecHub's double plan
};

// Per-thread buffers of one node chain (each [V]).
template <typename S>
struct NodeWork {
  std::unique_ptr<S[]> a, b, c;  // left uninitialised: every use writes a buffer whole before reading it
  std::vector<NodeTest<S>> tests;
  explicit NodeWork(int64_t vocab) : a(new S[vocab]), b(new S[vocab]), c(new S[vocab]) {}
};

// K-SEQ gamma search helpers: the tokens whose term min(g p, q) is still undecided live compacted in mp/mq
// (double, capacity V + 8); decided ones are folded into `low` (sum of q: fl(g p) >= q for the whole bracket) and
// `high` (sum of p: fl(g p) <= q for the whole bracket, the term is g p). Branch-free (the classes alternate
// unpredictably along the vocabulary); with AVX-512 the compaction is a compress into a register plus a full store.
#if defined(__AVX512F__)
template <typename S>
inline __m512d load8_pd(const S* x) {
  if constexpr (sizeof(S) == 4) {
    return _mm512_maskz_cvtps_pd(0xff, _mm256_loadu_ps(reinterpret_cast<const float*>(x)));
  } else {
    return _mm512_loadu_pd(reinterpret_cast<const double*>(x));
  }
}

// Sum of the 8 lanes (GCC 12 warns falsely inside _mm512_reduce_add_pd and _mm512_cvtps_pd, hence the maskz forms).
inline double hsum8(__m512d x) {
  alignas(64) double t[8];
  _mm512_store_pd(t, x);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

// Appends the lanes of `keep` to mp/mq at n (writes 8 lanes; the capacity has 8 spare) and returns the new count.
inline int64_t compress8(double* mp, double* mq, int64_t n, __mmask8 keep, __m512d pv, __m512d qv) {
  _mm512_storeu_pd(mp + n, _mm512_maskz_compress_pd(keep, pv));
  _mm512_storeu_pd(mq + n, _mm512_maskz_compress_pd(keep, qv));
  return n + __builtin_popcount(static_cast<unsigned>(keep));
}
#endif

// Initial classes over [1, K]: low iff p >= q (1 p = p), high iff K p <= q (and not low), else undecided.
template <typename S>
int64_t kseq_classify(const S* p, const S* q, int64_t vocab, double kd, double* mp, double* mq, double* low,
                      double* high) {
  int64_t n = 0, v = 0;
  double lo_sum = 0.0, hi_sum = 0.0;
#if defined(__AVX512F__)
  __m512d vlow = _mm512_setzero_pd(), vhigh = _mm512_setzero_pd();
  const __m512d vk = _mm512_set1_pd(kd);
  for (; v + 8 <= vocab; v += 8) {
    const __m512d pv = load8_pd(p + v), qv = load8_pd(q + v);
    const __mmask8 is_low = _mm512_cmp_pd_mask(pv, qv, _CMP_GE_OQ);
    const __mmask8 is_high = _mm512_cmp_pd_mask(_mm512_mul_pd(vk, pv), qv, _CMP_LE_OQ) & ~is_low;
    vlow = _mm512_mask_add_pd(vlow, is_low, vlow, qv);
    vhigh = _mm512_mask_add_pd(vhigh, is_high, vhigh, pv);
    n = compress8(mp, mq, n, static_cast<__mmask8>(~(is_low | is_high)), pv, qv);
  }
  lo_sum = hsum8(vlow);
  hi_sum = hsum8(vhigh);
#endif
  for (; v < vocab; ++v) {
    const double pv = static_cast<double>(p[v]), qv = static_cast<double>(q[v]);
    const int is_low = pv >= qv;
    const int is_high = (kd * pv <= qv) & !is_low;
    lo_sum += qv * static_cast<double>(is_low);  // products with 0/1 flags: GCC emits no branches
    hi_sum += pv * static_cast<double>(is_high);
    mp[n] = pv;
    mq[n] = qv;
    n += 1 - (is_low | is_high);
  }
  *low += lo_sum;
  *high += hi_sum;
  return n;
}

// After the step at g moved the bracket: up (hi = g) decides every token with fl(g p) <= q as high; otherwise
// (lo = g) every token with fl(g p) >= q as low. Returns the new undecided count.
inline int64_t kseq_fold(double* mp, double* mq, int64_t n, double g, bool up, double* low, double* high) {
  int64_t m = 0, j = 0;
  double lo_sum = 0.0, hi_sum = 0.0;
#if defined(__AVX512F__)
  __m512d vlow = _mm512_setzero_pd(), vhigh = _mm512_setzero_pd();
  const __m512d vg = _mm512_set1_pd(g);
  for (; j + 8 <= n; j += 8) {
    const __m512d pv = _mm512_loadu_pd(mp + j), qv = _mm512_loadu_pd(mq + j);
    const __m512d gp = _mm512_mul_pd(vg, pv);
    const __mmask8 done = up ? _mm512_cmp_pd_mask(gp, qv, _CMP_LE_OQ) : _mm512_cmp_pd_mask(gp, qv, _CMP_GE_OQ);
    if (up) {
      vhigh = _mm512_mask_add_pd(vhigh, done, vhigh, pv);
    } else {
      vlow = _mm512_mask_add_pd(vlow, done, vlow, qv);
    }
    m = compress8(mp, mq, m, static_cast<__mmask8>(~done), pv, qv);  // m <= j: never overwrites unread lanes
  }
  lo_sum = hsum8(vlow);
  hi_sum = hsum8(vhigh);
#endif
  for (; j < n; ++j) {
    const double pj = mp[j], qj = mq[j], gp = g * pj;
    const int to_high = static_cast<int>(up) & (gp <= qj);
    const int to_low = static_cast<int>(!up) & (gp >= qj);
    hi_sum += pj * static_cast<double>(to_high);
    lo_sum += qj * static_cast<double>(to_low);
    mp[m] = pj;
    mq[m] = qj;
    m += 1 - (to_high | to_low);
  }
  *low += lo_sum;
  *high += hi_sum;
  return m;
}

// K-SEQ: smallest g in [1, K] with h(g) = a(g) - 1 + (1 - beta(g))^K >= 0 by 40 double bisection steps (upper
// bracket), and beta(g), where a(g) = sum_v min(g p(v), q(v)) and beta(g) = sum_v min(p(v), q(v) / g) = a(g) / g.
// Every term is evaluated in double as the reference does (g * p, min with q), but a token whose term is decided
// for the whole bracket [lo, hi] is folded into two running sums (kseq_fold) and dropped, so each step only
// visits the tokens whose ratio q/p lies inside the bracket: about 2V terms in all instead of 41V. The sums differ
// from the reference's by round-off only.
constexpr double kKseqEqualTol = 1e-12;  // sum_v min(p, q) >= mass - tol: gamma* = 1 (reference KSEQ_EQUAL_TOL)

template <typename S>
void kseq_gamma_row(const S* p, const S* q, int64_t vocab, int64_t k, double* gamma, double* beta_out) {
  const double kd = static_cast<double>(k);
  double a1 = 0.0, mp_sum = 0.0, mq_sum = 0.0;
#pragma omp simd reduction(+ : a1, mp_sum, mq_sum)
  for (int64_t v = 0; v < vocab; ++v) {
    const double pv = static_cast<double>(p[v]), qv = static_cast<double>(q[v]);
    a1 += pv < qv ? pv : qv;
    mp_sum += pv;
    mq_sum += qv;
  }
  // p = q (kKseqEqualTol against the rows' own masses, as the reference: an fp32 row sums to 1 only within its
  // rounding, and h(1) = mass - 1 < 0 would move gamma to 1 + (1 - mass)^(1/K)): gamma* = 1
  const double mass = mp_sum > mq_sum ? mp_sum : mq_sum;
  if (k <= 1 || a1 >= mass - kKseqEqualTol || a1 - 1.0 + std::pow(1.0 - a1, kd) >= 0.0) {
    *gamma = 1.0;
    *beta_out = a1;
    return;
  }
  thread_local std::vector<double> mid_p, mid_q;
  mid_p.resize(vocab + 8);
  mid_q.resize(vocab + 8);
  double* mp = mid_p.data();  // raw pointers: every access to a thread_local costs a TLS lookup in a shared object
  double* mq = mid_q.data();
  double low = 0.0, high = 0.0;
  int64_t n = kseq_classify(p, q, vocab, kd, mp, mq, &low, &high);
  double lo = 1.0, hi = kd, a_hi = -1.0;  // a(hi), once hi moved
  for (int i = 0; i < 40; ++i) {
    const double mid = 0.5 * (lo + hi);
    double t = 0.0;
#pragma omp simd reduction(+ : t)
    for (int64_t j = 0; j < n; ++j) {
      const double gp = mid * mp[j];
      t += gp < mq[j] ? gp : mq[j];
    }
    const double a = (low + mid * high) + t;
    const bool up = a - 1.0 + std::pow(1.0 - a / mid, kd) >= 0.0;
    n = kseq_fold(mp, mq, n, mid, up, &low, &high);
    if (up) {
      hi = mid;
      a_hi = a;
    } else {
      lo = mid;
    }
  }
  if (a_hi < 0.0) a_hi = low + kd * high;  // hi never moved: every token is decided at K
  *gamma = hi;
  *beta_out = a_hi / hi;
}

// SpecHub's normaliser of Q(a, i) = p(a) p(i) / rest (docs/exactness.md): the sum of the non-hub probabilities, from
// which the sampler draws the second draft, accumulated in double (as the reference). 1 - p(a)
// differs from it by the row's rounding, which is the whole of it once p(a) is within a few ulps of 1.
template <typename S>
double hub_rest(const S* p, int64_t a, int64_t vocab) {
  double rest = 0.0;
#pragma omp simd reduction(+ : rest)
  for (int64_t v = 0; v < vocab; ++v) rest += v != a ? static_cast<double>(p[v]) : 0.0;
  return rest;
}

// One token's terms of the SpecHub transport plan, in double.
struct HubTerm {
  double qai, q1, r1, a2, q2;
};

template <typename S>
struct HubPlan {
  double pa, rest;
  HubPlan(const S* p, int64_t a, int64_t vocab) : pa(p[a]), rest(hub_rest(p, a, vocab)) {}
  // not_a = false (the hub) gives zeros
  HubTerm term(S pv, S qv, bool not_a) const {
    const double p_ = not_a ? static_cast<double>(pv) : 0.0, q_ = not_a ? static_cast<double>(qv) : 0.0;
    const double a1 = p_ < q_ ? p_ : q_;
    const double qai = rest > 0.0 ? pa * p_ / rest : 0.0;
    const double q1 = q_ - a1;
    const double a2 = qai < q1 ? qai : q1;
    return {qai, q1, p_ - a1, a2, q1 - a2};
  }
};

// Normalise `num` in place by its sum, or replace it by `fallback` when the mass is numerically zero.
template <typename S>
void normalize_or(S* num, const S* fallback, int64_t vocab) {
  const S tot_s = static_cast<S>(sum_row(num, vocab));
  if (tot_s <= static_cast<S>(zero_mass_tol<S>())) {
    for (int64_t v = 0; v < vocab; ++v) num[v] = fallback[v];
    return;
  }
  for (int64_t v = 0; v < vocab; ++v) num[v] = num[v] / tot_s;
}

// The test sequence of one node, independent of the uniforms, exactly as the reference's
// node_chain: fills w.tests in test order and returns the final residual (normalised; it may point into q).
// cand: the node's valid candidate tokens in draft order; hub: SpecHub's hub token of the node.
template <typename S>
const S* node_chain(Method method, const int64_t* cand, int64_t n_cand, const S* p, const S* q, int64_t hub,
                    int64_t vocab, NodeWork<S>& w) {
  w.tests.clear();
  S* bufs[2] = {w.a.get(), w.b.get()};
  int cur = 0;
  switch (method) {
    case Method::kSD:
    case Method::kRRS: {
      const S* r = q;
      for (int64_t j = 0; j < n_cand; ++j) {
        w.tests.push_back({j, p[cand[j]], r[cand[j]]});
        residual_row(r, p, vocab, bufs[cur]);
        r = bufs[cur];
        cur ^= 1;
      }
      return r;
    }
    case Method::kRRSw: {
      const S* r = q;
      S* sdraft = w.c.get();  // p^(k): p with the earlier candidates removed, renormalised
      for (int64_t v = 0; v < vocab; ++v) sdraft[v] = p[v];
      for (int64_t j = 0; j < n_cand; ++j) {
        const int64_t x = cand[j];
        w.tests.push_back({j, sdraft[x], r[x]});
        residual_row(r, sdraft, vocab, bufs[cur]);
        r = bufs[cur];
        cur ^= 1;
        sdraft[x] = S(0);
        const S tot_s = static_cast<S>(sum_row(sdraft, vocab));
        if (tot_s > S(0))
          for (int64_t v = 0; v < vocab; ++v) sdraft[v] = sdraft[v] / tot_s;
      }
      return r;
    }
    case Method::kKSeq: {
      double g, be;
      kseq_gamma_row(p, q, vocab, n_cand, &g, &be);
      if (be <= 0.0) {  // disjoint supports: nothing can be accepted; sample q directly
        for (int64_t j = 0; j < n_cand; ++j) w.tests.push_back({j, S(1), S(0)});
        return q;
      }
      const S gs = static_cast<S>(g);  // the reference multiplies compute-type tensors by the Python float g
      for (int64_t j = 0; j < n_cand; ++j) w.tests.push_back({j, gs * p[cand[j]], q[cand[j]]});
      const S cs = static_cast<S>((1.0 - std::pow(1.0 - be, static_cast<double>(n_cand))) / be);
      S* num = bufs[0];
      for (int64_t v = 0; v < vocab; ++v) {
        const S qg = q[v] / gs;
        const S m = p[v] < qg ? p[v] : qg;
        const S d = q[v] - cs * m;
        num[v] = d > S(0) ? d : S(0);
      }
      normalize_or(num, q, vocab);
      return num;
    }
    case Method::kSpecHub: {
      if (n_cand == 1) {
        w.tests.push_back({0, p[cand[0]], q[cand[0]]});
        residual_row(q, p, vocab, bufs[0]);
        return bufs[0];
      }
      // The plan in double whatever S is: when p(a) ~ 1 the pairs (a, .) carry nearly all of the draft mass, and S
      // rounding of their terms would become the output law's error. Only the final residual is stored in S.
      const int64_t a = hub;
      const HubPlan plan(p, a, vocab);
      double s_ai = 0.0, s_ia = 0.0, tot_q2 = 0.0;
#pragma omp simd reduction(+ : s_ai, s_ia, tot_q2)
      for (int64_t v = 0; v < vocab; ++v) {
        const HubTerm t = plan.term(p[v], q[v], v != a);
        s_ai += t.qai - t.a2;
        s_ia += t.r1;
        tot_q2 += t.q2;
      }
      const double qa = q[a];
      const double a3 = qa < s_ai ? qa : s_ai;
      const double qa_left = qa - a3;
      const double a4 = qa_left < s_ia ? qa_left : s_ia;
      const double left = qa - a3 - a4;
      const double fin_a = left > 0.0 ? left : 0.0;
      const double tot = tot_q2 + fin_a;
      // a hub test whose leftover mass is 0 is never reached: numerator 0 (as the reference)
      if (cand[0] == a) {  // pair type (a, i): the non-hub token (slot 1) is tested first
        const HubTerm t = plan.term(p[cand[1]], q[cand[1]], true);
        w.tests.push_back({1, t.qai, t.q1});
        w.tests.push_back({0, s_ai, s_ai > 0.0 ? qa : 0.0});
      } else {  // pair type (i, a)
        const int64_t i = cand[0];
        w.tests.push_back({0, static_cast<double>(p[i]), static_cast<double>(q[i])});
        w.tests.push_back({1, s_ia, s_ia > 0.0 ? qa_left : 0.0});
      }
      if (tot <= zero_mass_tol<double>()) return q;  // the double plan's leftover is real, not S round-off
      S* fin = w.c.get();
      for (int64_t v = 0; v < vocab; ++v)
        fin[v] = static_cast<S>((v == a ? fin_a : plan.term(p[v], q[v], true).q2) / tot);
      return fin;
    }
    case Method::kGDS: {
      // Greedy draft sampling: the last candidate was drawn from p without the others (the set D) and is tested
      // first against that law; each token of D then takes its share of the residual still untested.
      const int64_t n_det = n_cand - 1, x = cand[n_det];
      S* s = w.c.get();
      for (int64_t v = 0; v < vocab; ++v) s[v] = p[v];
      for (int64_t j = 0; j < n_det; ++j) s[cand[j]] = S(0);
      const S rest = static_cast<S>(sum_row(s, vocab));
      for (int64_t v = 0; v < vocab; ++v) s[v] = s[v] / rest;
      w.tests.push_back({n_det, static_cast<double>(s[x]), static_cast<double>(q[x])});
      S* r = bufs[0];
      residual_row(q, s, vocab, r);
      S left = S(1);
      for (int64_t j = 0; j < n_det; ++j) {
        w.tests.push_back({j, static_cast<double>(left), static_cast<double>(r[cand[j]])});
        left = left - r[cand[j]];
      }
      for (int64_t j = 0; j < n_det; ++j) r[cand[j]] = S(0);
      normalize_or(r, q, vocab);
      return r;
    }
    default:
      break;
  }
  return q;
}

// min(1, num/den) as the probability of the division-free test U * den < num, U ~ U[0, 1).
template <typename S>
S ratio_prob(S num, S den) {
  if (den <= S(0)) return num > S(0) ? S(1) : S(0);
  S r = num / den;
  r = r < S(1) ? r : S(1);
  return r > S(0) ? r : S(0);
}

// One node per row: slot (-1 = none accepted) and token; accept_prob [K] and final [V] are always written
// (the analytic diagnostics used by exact enumeration, docs/exactness.md; zero for invalid slots).
template <typename S>
void verify_node_row(Method method,
                     const int64_t* cand,      // [K]
                     const bool* cand_valid,   // [K]
                     int64_t k,
                     const S* p, const S* q,   // [V] each
                     const double* accept_u,   // [K] uniforms in [0, 1), slot j uses accept_u[j]
                     const FinalNoise& fin_noise,  // the final sample's uniforms
                     int64_t hub, int64_t vocab, NodeWork<S>& w, std::vector<int64_t>& slots,
                     std::vector<int64_t>& toks,
                     int64_t* slot_out, int64_t* token_out,
                     S* accept_prob,  // [K]
                     S* final_out) {  // [V]
  slots.clear();
  toks.clear();
  for (int64_t j = 0; j < k; ++j) {
    accept_prob[j] = S(0);
    if (cand_valid[j]) {
      slots.push_back(j);
      toks.push_back(cand[j]);
    }
  }
  const S* fin = node_chain(method, toks.data(), static_cast<int64_t>(toks.size()), p, q, hub, vocab, w);
  int64_t chosen = -1;
  for (const NodeTest<S>& t : w.tests) {
    const int64_t real = slots[t.slot];
    accept_prob[real] = static_cast<S>(ratio_prob(t.num, t.den));
    if (chosen < 0 && accept_u[real] * t.den < t.num) chosen = real;
  }
  *slot_out = chosen;
  *token_out = chosen >= 0 ? cand[chosen] : sample_final(fin, vocab, fin_noise);
  for (int64_t v = 0; v < vocab; ++v) final_out[v] = fin[v];
}

// The walk's view of one node (evaluated lazily): the tests of node_chain in the same order
// and with the same operands, but a residual (or SpecHub's sums, or K-SEQ's gamma) is computed only when a test
// or the final sample needs it, so a node whose first candidate is accepted reads four numbers. Returns the
// accepted candidate slot, -1 when every test failed (*fin = the final residual, normalised) or -2 when a test
// needs a uniform beyond accept_u[ku - 1].
template <typename S>
int64_t node_walk(Method method, const int64_t* cand, int64_t n_cand, const S* p, const S* q, int64_t hub,
                  int64_t vocab, const double* u, int64_t ku, NodeWork<S>& w, const S** fin) {
  auto pass = [u](int64_t slot, double den, double num) { return u[slot] * den < num; };
  S* bufs[2] = {w.a.get(), w.b.get()};
  int cur = 0;
  switch (method) {
    case Method::kSD:
    case Method::kRRS:
    case Method::kRRSw: {
      const bool without = method == Method::kRRSw;
      const S* r = q;
      const S* s = p;  // RRSw: p^(j), p with the earlier candidates removed and renormalised
      for (int64_t j = 0; j < n_cand; ++j) {
        if (j >= ku) return -2;
        const int64_t x = cand[j];
        if (pass(j, s[x], r[x])) return j;
        residual_row(r, s, vocab, bufs[cur]);
        r = bufs[cur];
        cur ^= 1;
        if (without && j + 1 < n_cand) {
          S* sd = w.c.get();
          if (s != sd)
            for (int64_t v = 0; v < vocab; ++v) sd[v] = p[v];
          s = sd;
          sd[x] = S(0);
          const S tot_s = static_cast<S>(sum_row(sd, vocab));
          if (tot_s > S(0))
            for (int64_t v = 0; v < vocab; ++v) sd[v] = sd[v] / tot_s;
        }
      }
      *fin = r;
      return -1;
    }
    case Method::kKSeq: {
      // The test is U * fl(gs * p(x)) < q(x) with gs = fl(gamma) in [1, fl(K)], and fl(gs * p(x)) does not decrease
      // with gs: a candidate that passes at K or fails at 1 is decided without gamma.
      const S k_s = static_cast<S>(n_cand);
      int64_t j = 0;
      for (; j < n_cand; ++j) {
        if (j >= ku) return -2;
        const int64_t x = cand[j];
        if (!(p[x] > S(0))) break;
        if (pass(j, k_s * p[x], q[x])) return j;
        if (pass(j, p[x], q[x])) break;
      }
      const S* r = node_chain(method, cand, n_cand, p, q, hub, vocab, w);
      for (const NodeTest<S>& t : w.tests) {
        if (t.slot < j) continue;  // already failed for every gamma
        if (t.slot >= ku) return -2;
        if (pass(t.slot, t.den, t.num)) return t.slot;
      }
      *fin = r;
      return -1;
    }
    case Method::kSpecHub: {
      // The first test needs no residual: (p(i), q(i)) for a pair (i, a), (Qai(i), q1(i)) for a pair (a, i), whose
      // normaliser is one sum over p.
      if (n_cand == 2) {
        const int64_t a = hub;
        const bool hub_first = cand[0] == a;
        const int64_t i = hub_first ? cand[1] : cand[0];
        const int64_t slot = hub_first ? 1 : 0;
        if (slot >= ku) return -2;
        if (hub_first) {
          const HubTerm t = HubPlan<S>(p, a, vocab).term(p[i], q[i], i != a);
          if (pass(slot, t.qai, t.q1)) return slot;
        } else if (pass(slot, p[i], q[i])) {
          return slot;
        }
      }
      const S* r = node_chain(method, cand, n_cand, p, q, hub, vocab, w);
      for (const NodeTest<S>& t : w.tests) {
        if (t.slot >= ku) return -2;
        if (pass(t.slot, t.den, t.num)) return t.slot;
      }
      *fin = r;
      return -1;
    }
    case Method::kGDS: {
      // node_chain's tests without its rows: the draw's test needs the tail's sum (one pass over p), the greedy
      // tokens' tests the residual's mass (one pass over p and q); the residual itself only when every test failed.
      const int64_t n_det = n_cand - 1, x = cand[n_det];
      if (n_det >= ku) return -2;
      double rest = sum_row(p, vocab);
      for (int64_t j = 0; j < n_det; ++j) rest -= static_cast<double>(p[cand[j]]);
      const S rest_s = static_cast<S>(rest);
      if (pass(n_det, static_cast<double>(p[x] / rest_s), static_cast<double>(q[x]))) return n_det;
      double tot = 0.0;
#pragma omp simd reduction(+ : tot)
      for (int64_t v = 0; v < vocab; ++v) {
        const S m = q[v] - p[v] / rest_s;
        tot += static_cast<double>(m > S(0) ? m : S(0));
      }
      for (int64_t j = 0; j < n_det; ++j) {  // s is 0 on D: the residual's numerator there is q itself
        const S m = q[cand[j]] - p[cand[j]] / rest_s;
        tot += static_cast<double>(q[cand[j]]) - static_cast<double>(m > S(0) ? m : S(0));
      }
      const S tot_s = static_cast<S>(tot);
      const bool keep_q = tot_s <= static_cast<S>(zero_mass_tol<S>());  // residual_row's zero-mass rule
      S left = S(1);
      for (int64_t j = 0; j < n_det; ++j) {
        if (j >= ku) return -2;
        const S rd = keep_q ? q[cand[j]] : q[cand[j]] / tot_s;
        if (pass(j, static_cast<double>(left), static_cast<double>(rd))) return j;
        left = left - rd;
      }
      *fin = node_chain(method, cand, n_cand, p, q, hub, vocab, w);
      return -1;
    }
    default:
      break;
  }
  return -2;
}

// ---- block verification of a chain (docs/methods.md, Block verification) ----

// chain[0..len] = the root and the drafted nodes in depth order; rows p/q [N, V] by node. With the weights
// w_0 = 1, w_i = min(1, w_{i-1} q(X_i) / p(X_i)) (double), the deepest level i whose test passes is tau: level
// i < len tests U_i * (S_i + 1 - w_i) < S_i with S_i = sum_v (w_i q_i(v) - p_i(v))^+, the last level U_L < w_L. The
// next token comes from q at the last node when tau = len, else from Norm[(w_tau q - p)^+] (q under the float64
// zero-mass rule). Returns tau; writes the next token.
template <typename S>
int64_t block_chain_row(const int64_t* tokens, const int64_t* chain, int64_t len, const S* p_rows, const S* q_rows,
                        const double* accept_u, int64_t ku, const FinalNoise& fin, int64_t vocab,
                        std::vector<double>& w, std::vector<double>& buf, int64_t* next_token) {
  w.assign(len + 1, 1.0);
  for (int64_t i = 1; i <= len; ++i) {
    const int64_t prev = chain[i - 1], x = tokens[chain[i]];
    w[i] = std::min(w[i - 1] * static_cast<double>(q_rows[prev * vocab + x]) /
                        static_cast<double>(p_rows[prev * vocab + x]),
                    1.0);
  }
  const auto excess_sum = [&](int64_t node, double wi) {
    const S* p = p_rows + node * vocab;
    const S* q = q_rows + node * vocab;
    double tot = 0.0;
    for (int64_t v = 0; v < vocab; ++v)
      tot += std::max(wi * static_cast<double>(q[v]) - static_cast<double>(p[v]), 0.0);
    return tot;
  };
  int64_t tau = 0;
  for (int64_t i = len; i >= 1; --i) {
    const double u = accept_u[chain[i] * ku];
    bool ok;
    if (i == len) {
      ok = u * 1.0 < w[i];
    } else {
      const double s = excess_sum(chain[i], w[i]);
      ok = u * (s + (1.0 - w[i])) < s;
    }
    if (ok) {
      tau = i;
      break;
    }
  }
  const int64_t node = chain[tau];
  if (tau == len) {
    *next_token = sample_final(q_rows + node * vocab, vocab, fin);
    return tau;
  }
  const S* p = p_rows + node * vocab;
  const S* q = q_rows + node * vocab;
  if (static_cast<int64_t>(buf.size()) < vocab) buf.resize(vocab);
  double tot = 0.0;
  for (int64_t v = 0; v < vocab; ++v) {
    buf[v] = std::max(w[tau] * static_cast<double>(q[v]) - static_cast<double>(p[v]), 0.0);
    tot += buf[v];
  }
  if (tot <= zero_mass_tol<double>()) {
    for (int64_t v = 0; v < vocab; ++v) buf[v] = static_cast<double>(q[v]);
  } else {
    for (int64_t v = 0; v < vocab; ++v) buf[v] = buf[v] / tot;
  }
  *next_token = sample_final(buf.data(), vocab, fin);
  return tau;
}

// One node on the path of a traversal walk: its acceptance probability a, and once a child of it was rejected
// (updated) the (den, num) of its test. Its target and draft laws are the rows of TreeWork::tr_r / tr_d at its depth.
struct TraversalLevel {
  int64_t node;
  double a, den, num;
  bool own_r, own_d;  // the level's row of TreeWork::tr_r / tr_d holds R / D (else they are the node's q / p rows)
};

struct TreeWork {
  std::vector<int64_t> child_start, child_list, alive, next_alive, cands, toks, path, ranks;
  std::vector<double> weights, law;  // block verification
  std::vector<TraversalLevel> levels;  // traversal verification: the path from the root
  std::vector<double> tr_r, tr_d;      // [depth + 1, V] target and draft laws along it, once updated
};

// ---- traversal verification of a tree (docs/methods.md, Traversal verification) ----

// The walk descends to the first child still in the tree (t.next_alive[n] counts the removed children of n: they are
// always its first ones) until a node has none, and tests it: U * den < num once a child of it was rejected, else
// U < a. An accepted node ends the walk (the next token from its target law R); a rejected one leaves the tree and its
// parent P is updated: excess = (a_P R_P - D_P)^+, S = sum, a_P = S / (S + 1 - a_P) with the test (S + 1 - a_P, S),
// R_P = excess / S (kept when S <= 1e-12) and, for children drawn without replacement, D_P loses the rejected token
// and is renormalised. A child starts with a = min(1, a_P R_P(x) / D_P(x)) (0 where D_P(x) = 0), R = q, D = p of its
// own rows. The root, without children left, is accepted. Returns the depth of the accepted node (t.path holds the
// path, t.ranks the sibling ranks) or -1 when the path would exceed max_depth.
template <typename S>
int64_t traversal_row(const int64_t* tokens, const S* p_rows, const S* q_rows, const double* accept_u, int64_t ku,
                      const FinalNoise& fin, int64_t n, int64_t vocab, int64_t max_depth, bool swor, TreeWork& t,
                      int64_t* next_token) {
  // a level reads its node's own q / p rows until an update gives it a row of its own (the same doubles)
  t.levels.assign(1, TraversalLevel{0, 1.0, 1.0, 1.0, false, false});
  const size_t rows = static_cast<size_t>(max_depth + 1) * vocab;
  if (t.tr_r.size() < rows) {
    t.tr_r.resize(rows);
    t.tr_d.resize(rows);
  }
  const auto r_at = [&](int64_t depth, int64_t v) {
    const TraversalLevel& lv = t.levels[depth];
    return lv.own_r ? t.tr_r[depth * vocab + v] : static_cast<double>(q_rows[lv.node * vocab + v]);
  };
  const auto d_at = [&](int64_t depth, int64_t v) {
    const TraversalLevel& lv = t.levels[depth];
    return lv.own_d ? t.tr_d[depth * vocab + v] : static_cast<double>(p_rows[lv.node * vocab + v]);
  };
  t.next_alive.assign(n, 0);  // removed children per node
  while (true) {
    int64_t depth = static_cast<int64_t>(t.levels.size()) - 1;
    int64_t node = t.levels.back().node;
    while (t.child_start[node] + t.next_alive[node] < t.child_start[node + 1]) {  // descend to the first child left
      const int64_t child = t.child_list[t.child_start[node] + t.next_alive[node]];
      if (depth + 1 > max_depth) return -1;
      const int64_t x = tokens[child];
      const double rx = r_at(depth, x), dx = d_at(depth, x);
      const double a = dx > 0.0 ? std::min(t.levels.back().a * rx / dx, 1.0) : 0.0;
      t.levels.push_back(TraversalLevel{child, a, 1.0, a, false, false});
      ++depth;
      node = child;
    }
    const TraversalLevel& lv = t.levels.back();
    if (depth == 0 || accept_u[node * ku] * lv.den < lv.num) {
      *next_token = lv.own_r ? sample_final(t.tr_r.data() + depth * vocab, vocab, fin)
                             : sample_final(q_rows + node * vocab, vocab, fin);
      t.path.clear();
      t.ranks.clear();
      for (int64_t k = 1; k <= depth; ++k) {
        t.path.push_back(t.levels[k].node);
        t.ranks.push_back(t.next_alive[t.levels[k - 1].node]);
      }
      return depth;
    }
    // rejected: the node leaves the tree, its parent is updated
    t.levels.pop_back();
    const int64_t up_depth = depth - 1;
    const double a_p = t.levels.back().a;
    ++t.next_alive[t.levels.back().node];
    double mass = 0.0;
    for (int64_t v = 0; v < vocab; ++v) mass += std::max(a_p * r_at(up_depth, v) - d_at(up_depth, v), 0.0);
    const double den = mass + (1.0 - a_p);
    if (mass > zero_mass_tol<double>()) {
      double* ru = t.tr_r.data() + up_depth * vocab;
      for (int64_t v = 0; v < vocab; ++v) ru[v] = std::max(a_p * r_at(up_depth, v) - d_at(up_depth, v), 0.0) / mass;
      t.levels.back().own_r = true;
    }
    if (swor) {  // the rejected token leaves the law the next sibling was drawn from
      double* du = t.tr_d.data() + up_depth * vocab;
      if (!t.levels.back().own_d) {
        for (int64_t v = 0; v < vocab; ++v) du[v] = d_at(up_depth, v);
        t.levels.back().own_d = true;
      }
      du[tokens[node]] = 0.0;
      double tot = 0.0;
      for (int64_t v = 0; v < vocab; ++v) tot += du[v];
      if (tot > 0.0)
        for (int64_t v = 0; v < vocab; ++v) du[v] = du[v] / tot;
    }
    TraversalLevel& up = t.levels.back();
    up.a = den > 0.0 ? mass / den : a_p;
    up.den = den;
    up.num = mass;
  }
}

// ---- tree walk (SpecTr alive sets; greedy mode) ----



// One row. Returns n_accepted; writes accepted_nodes/accepted_rank [max_depth] (-1 padded) and next_token.
// accept_u [N, KU]: the j-th test candidate of node n uses accept_u[n * KU + j]. Returns -1 when a walk needs
// more uniforms than KU or a longer path than max_depth (the adapter turns that into an error).
template <typename S>
int64_t verify_tree_row(const int64_t* tokens,  // [N]
                        const int64_t* parent,  // [N]
                        const bool* valid,      // [N]
                        const S* p_rows,        // [N, V] (null when greedy)
                        const S* q_rows,        // [N, V]
                        Method method,
                        const int64_t* hub,       // [N] (spechub) or null
                        const double* accept_u,   // [N, KU]
                        const FinalNoise& fin_noise,  // the final sample's uniforms
                        bool greedy, const int64_t* eos, int64_t n_eos, int64_t n, int64_t vocab, int64_t ku,
                        int64_t max_depth, NodeWork<S>& w, TreeWork& t,
                        int64_t* acc_nodes,  // [max_depth]
                        int64_t* acc_rank,   // [max_depth]
                        int64_t* next_token) {
  const bool kseq = method == Method::kKSeq;
  // children of every node in index order (CSR)
  t.child_start.assign(n + 1, 0);
  for (int64_t m = 1; m < n; ++m)
    if (valid[m]) ++t.child_start[parent[m] + 1];
  for (int64_t m = 0; m < n; ++m) t.child_start[m + 1] += t.child_start[m];
  t.child_list.assign(t.child_start[n], 0);
  t.next_alive.assign(n, 0);  // reused as fill cursors
  for (int64_t m = 1; m < n; ++m)
    if (valid[m]) {
      const int64_t par = parent[m];
      t.child_list[t.child_start[par] + t.next_alive[par]++] = m;
    }
  t.alive.assign(1, 0);
  t.path.clear();
  t.ranks.clear();
  if ((method == Method::kTraversal || method == Method::kTraversalW) && !greedy) {
    int64_t out = -1;
    int64_t m = traversal_row(tokens, p_rows, q_rows, accept_u, ku, fin_noise, n, vocab, max_depth,
                              method == Method::kTraversalW, t, &out);
    if (m < 0) return -1;
    for (int64_t d = 0; d < m; ++d)
      if (is_eos(tokens[t.path[d]], eos, n_eos)) {  // an accepted EOS ends the row
        m = d + 1;
        out = -1;
        break;
      }
    for (int64_t d = 0; d < max_depth; ++d) {
      acc_nodes[d] = d < m ? t.path[d] : -1;
      acc_rank[d] = d < m ? t.ranks[d] : -1;
    }
    *next_token = out;
    return m;
  }
  if (method == Method::kBlock && !greedy) {
    t.cands.assign(1, 0);  // the chain: each node's first (only) child
    while (t.child_start[t.cands.back()] < t.child_start[t.cands.back() + 1])
      t.cands.push_back(t.child_list[t.child_start[t.cands.back()]]);
    const int64_t len = static_cast<int64_t>(t.cands.size()) - 1;
    if (len > max_depth) return -1;
    int64_t out = -1;
    int64_t tau = block_chain_row(tokens, t.cands.data(), len, p_rows, q_rows, accept_u, ku, fin_noise, vocab,
                                  t.weights, t.law, &out);
    for (int64_t d = 1; d <= tau; ++d)
      if (is_eos(tokens[t.cands[d]], eos, n_eos)) {  // an accepted EOS ends the row
        tau = d;
        out = -1;
        break;
      }
    for (int64_t d = 0; d < max_depth; ++d) {
      acc_nodes[d] = d < tau ? t.cands[d + 1] : -1;
      acc_rank[d] = d < tau ? 0 : -1;
    }
    *next_token = out;
    return tau;
  }
  bool done = false;
  int64_t out = -1;
  while (!done) {
    const int64_t rep = t.alive[0];
    t.cands.clear();
    if (kseq) {
      for (int64_t m : t.alive)
        for (int64_t c = t.child_start[m]; c < t.child_start[m + 1]; ++c) t.cands.push_back(t.child_list[c]);
    } else {
      for (int64_t c = t.child_start[rep]; c < t.child_start[rep + 1]; ++c) t.cands.push_back(t.child_list[c]);
    }
    const S* q = q_rows + rep * vocab;
    if (t.cands.empty()) {
      out = greedy ? argmax_row(q, vocab) : sample_final(q, vocab, fin_noise);
      break;
    }
    t.toks.clear();
    for (int64_t c : t.cands) t.toks.push_back(tokens[c]);
    const int64_t n_cand = static_cast<int64_t>(t.cands.size());
    int64_t chosen = -1;
    if (greedy) {
      const int64_t target = argmax_row(q, vocab);
      for (int64_t j = 0; j < n_cand && chosen < 0; ++j)
        if (t.toks[j] == target) chosen = j;
      if (chosen < 0) {
        out = target;
        done = true;
      }
    } else {
      const S* fin = nullptr;
      chosen = node_walk(method, t.toks.data(), n_cand, p_rows + rep * vocab, q, hub ? hub[rep] : -1, vocab,
                         accept_u + rep * ku, ku, w, &fin);
      if (chosen == -2) return -1;
      if (chosen < 0) {
        out = sample_final(fin, vocab, fin_noise);
        done = true;
      }
    }
    if (chosen >= 0) {
      const int64_t child = t.cands[chosen];
      if (static_cast<int64_t>(t.path.size()) >= max_depth) return -1;
      t.path.push_back(child);
      t.ranks.push_back(chosen);
      if (is_eos(t.toks[chosen], eos, n_eos)) {
        out = -1;
        done = true;
      }
      t.next_alive.clear();
      if (kseq) {
        for (int64_t j = 0; j < n_cand; ++j)
          if (t.toks[j] == t.toks[chosen]) t.next_alive.push_back(t.cands[j]);
      } else {
        t.next_alive.push_back(child);
      }
      t.alive.swap(t.next_alive);
    }
  }
  // Rebuild the accepted path from the last node's ancestors so that it is parent-consistent even when SpecTr
  // accepted a token through a duplicate chain (same tokens, same KV).
  const int64_t m_acc = static_cast<int64_t>(t.path.size());
  if (m_acc > 0) {
    int64_t node = t.path[m_acc - 1];
    for (int64_t d = m_acc - 1; d >= 0; --d) {
      t.path[d] = node;
      node = parent[node];
    }
  }
  for (int64_t d = 0; d < max_depth; ++d) {
    acc_nodes[d] = d < m_acc ? t.path[d] : -1;
    acc_rank[d] = d < m_acc ? t.ranks[d] : -1;
  }
  *next_token = out;
  return m_acc;
}

}  // namespace specdec
