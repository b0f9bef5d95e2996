// Tree-drafting kernels (stochastic beam search, SpecHub drafting): one row per call, raw pointers
// + sizes. Scores are formed in double exactly as the torch reference forms them, so the selections (integer
// outputs) are identical; ties break to the lower (flattened) index.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "specdec/common.h"
#include "specdec/sampling.h"
#include "specdec/verify.h"

namespace specdec {

// ---- SpecHub drafting ----

// hub = argmax logp (first maximum); (y1, y2) = Gumbel-top-2 with the reference's validity rule; drafts (a, y2) if
// y1 == a else (y1, a); slot 1 is invalid when p(a) ~ 1 (1 - p(a) <= 1e-7), when y2 is invalid, or when V = 1.
template <typename T>
void spechub_sample_row(const T* logp,    // [V]
                        const double* u,  // [V] uniforms in (0, 1)
                        int64_t vocab,
                        int64_t* tokens,  // [2] out (slot 0, slot 1), -1 where invalid
                        int64_t* hub,     // [1] out
                        bool* valid) {    // [2] out
  const int64_t a = argmax_row(logp, vocab);
  int64_t y[2] = {-1, -1};
  bool y_valid[2] = {false, false};
  double score[2];
  gumbel_topk_row(logp, u, vocab, vocab < 2 ? vocab : 2, y, y_valid, score, nullptr);
  const bool first_is_hub = y[0] == a;
  const bool single = (1.0 - ::exp(as_double(logp[a]))) <= kSworMassEps;
  const bool v2 = (first_is_hub ? y_valid[1] : true) && !single;
  tokens[0] = first_is_hub ? a : y[0];
  tokens[1] = v2 ? (first_is_hub ? y[1] : a) : -1;
  valid[0] = true;
  valid[1] = v2;
  *hub = a;
}

// ---- stochastic beam search step ----

// log(1 - exp(a)) for a <= 0 in the reference's branch form (Kool et al. 2019, App. B.3).
inline double log1mexp(double a) { return a > -kLn2 ? ::log(-::expm1(a)) : ::log1p(-::exp(a)); }

// Stable Trunc(u, phit, Z) = u - softplus(u - phit + log1mexp(phit - Z)) with the reference's guards, evaluated
// in the reference's operation order.
inline double truncated_gumbel(double u, double phit, double z) {
  if (phit == -INFINITY) return -INFINITY;
  if (phit == z) return u;
  const double d = phit - z;
  const double v = (u - phit) + log1mexp(d < 0.0 ? d : 0.0);
  return u - ((v > 0.0 ? v : 0.0) + ::log1p(::exp(-::fabs(v))));
}

// One candidate of the global selection: truncated score, flattened index k * V + v, sequence log-prob.
struct BeamCand {
  double psi;
  int64_t flat;
  double phi;
};

inline bool beam_before(const BeamCand& a, const BeamCand& b) { return beats(a.psi, a.flat, b.psi, b.flat); }

// Per-thread scratch of one parent.
struct BeamWork {
  std::vector<int64_t> idx;
  std::vector<double> phit, psi;
  std::vector<std::pair<double, int64_t>> heap;
};

// The wsel best children of one valid beam entry by (psi desc, token asc), written to out[0..wsel).
// Trunc is monotone in phit, so they are the top-wsel by perturbed score phit: one pruned
// Gumbel race for the top wsel + 1, then Trunc of those only. The extra (wsel+1)-th candidate certifies the cut:
// when its psi is below the smallest selected psi by more than the rounding of the formula, no other child can
// tie or beat a selected one; otherwise (a psi tie, or Trunc flattened by u << Z) psi is evaluated for every child.
template <typename T>
void sbs_parent(const T* logp,    // [V] conditional draft log-probs of the entry
                const double* u,  // [V] uniforms in (0, 1)
                int64_t vocab, double sig, double gam, int64_t wsel, int64_t slot, BeamWork& w,
                BeamCand* out) {  // [wsel] out
  auto phi_of = [logp, sig](int64_t v) { return sig + as_double(logp[v]); };
  const int64_t kk = wsel < vocab ? wsel + 1 : vocab;
  w.idx.resize(kk);
  w.phit.resize(kk);
  w.psi.resize(kk);
  w.heap.resize(kk > kTopkBuffer ? kk : 0);
  race_topk(vocab, u, kk, phi_of, phi_of, w.idx.data(), w.phit.data(), w.heap.data());
  const double z = w.phit[0];  // the row maximum of phit
  double min_sel = INFINITY;
  for (int64_t j = 0; j < kk; ++j) {
    w.psi[j] = truncated_gumbel(gam, w.phit[j], z);
    if (j < wsel) min_sel = std::min(min_sel, w.psi[j]);
  }
  bool exact = kk == wsel || w.psi[wsel] == -INFINITY;
  if (!exact) {
    const double margin = 1e-9 * (1.0 + ::fabs(gam) + ::fabs(z) + ::fabs(w.phit[wsel]));
    exact = w.psi[wsel] < min_sel - margin;
  }
  if (exact) {
    for (int64_t j = 0; j < wsel; ++j) out[j] = {w.psi[j], slot * vocab + w.idx[j], phi_of(w.idx[j])};
    return;
  }
  // Fallback: psi of every child, the wsel best by (psi desc, index asc) kept in a sorted buffer.
  int64_t count = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double psi = truncated_gumbel(gam, phi_of(v) + gumbel(u[v]), z);
    const BeamCand c{psi, slot * vocab + v, phi_of(v)};
    if (count == wsel && !beam_before(c, out[wsel - 1])) continue;
    int64_t j = count < wsel ? count : wsel - 1;
    while (j > 0 && beam_before(c, out[j - 1])) {
      out[j] = out[j - 1];
      --j;
    }
    out[j] = c;
    if (count < wsel) ++count;
  }
}

// Global top-w_out of the candidates of one batch row by (psi desc, flattened index asc); psi = -inf is invalid.
inline void sbs_select(BeamCand* cand, int64_t n_cand, int64_t vocab, int64_t w_out,
                       int64_t* parent_slot,  // [w_out] out, -1 where invalid
                       int64_t* tokens,       // [w_out] out, -1 where invalid
                       double* sigma,         // [w_out] out, -inf where invalid
                       double* gamma,         // [w_out] out, descending, -inf where invalid
                       bool* valid) {         // [w_out] out
  std::partial_sort(cand, cand + w_out, cand + n_cand, beam_before);
  for (int64_t j = 0; j < w_out; ++j) {
    const BeamCand& c = cand[j];
    const bool ok = c.psi > -INFINITY;
    parent_slot[j] = ok ? c.flat / vocab : -1;
    tokens[j] = ok ? c.flat % vocab : -1;
    sigma[j] = ok ? c.phi : -INFINITY;
    gamma[j] = ok ? c.psi : -INFINITY;
    valid[j] = ok;
  }
}

}  // namespace specdec
