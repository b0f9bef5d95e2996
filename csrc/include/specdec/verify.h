// Verification kernels (spec §2.4, §4.1, §8): one batch row per call, raw pointers + sizes.
//
// S is the compute type of the probabilities (float, or double in fp64 oracle mode) like the reference's `cd`.
// Acceptance tests are division-free and compared in double: accept x iff U * p(x) < q(x). Residuals follow the
// zero-mass rule of spec §2.4, and every sample is a Gumbel race over log(probs) with the final noise.
#pragma once

#include <cstdint>

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

// First maximum of a row (greedy mode; ties -> lowest id like torch.argmax).
template <typename S>
int64_t argmax_row(const S* x, int64_t vocab) {
  int64_t best_i = 0;
  for (int64_t v = 1; v < vocab; ++v)
    if (x[v] > x[best_i]) best_i = v;
  return best_i;
}

// res(r, s) = Norm[(r - s)^+] written to out, or r itself when the mass is <= the zero-mass tolerance.
template <typename S>
void residual_row(const S* r, const S* s, int64_t vocab, S* out) {
  double tot = 0.0;
  for (int64_t v = 0; v < vocab; ++v) {
    const S m = r[v] - s[v];
    out[v] = m > S(0) ? m : S(0);
    tot += static_cast<double>(out[v]);
  }
  const S tot_s = static_cast<S>(tot);
  if (tot_s <= static_cast<S>(zero_mass_tol<S>())) {
    for (int64_t v = 0; v < vocab; ++v) out[v] = r[v];
    return;
  }
  for (int64_t v = 0; v < vocab; ++v) out[v] = out[v] / tot_s;
}

inline bool is_eos(int64_t x, const int64_t* eos, int64_t n_eos) {
  for (int64_t i = 0; i < n_eos; ++i)
    if (eos[i] == x) return true;
  return false;
}

// Spec §4.1 chain speculative sampling of one row (greedy mode: spec §8, accept iff x == argmax q).
// Returns n_accepted and writes the correction / bonus token (-1 if the row stopped after an accepted EOS).
template <typename S>
int64_t verify_chain_row(const int64_t* draft,    // [L]
                         const S* p,              // [L, V] draft laws (unused when greedy, may be null)
                         const S* q,              // [L + 1, V] target laws (logits are fine when greedy)
                         int64_t len,             // verify draft[0:len]
                         const double* accept_u,  // [L] uniforms in [0, 1)
                         const double* fin,       // [V] uniforms in (0, 1) for the final sample
                         bool greedy, const int64_t* eos, int64_t n_eos, int64_t vocab,
                         S* scratch,  // [V]
                         int64_t* next_token) {
  for (int64_t j = 0; j < len; ++j) {
    const int64_t x = draft[j];
    const S* qj = q + j * vocab;
    bool ok;
    if (greedy) {
      ok = x == argmax_row(qj, vocab);
    } else {
      const S* pj = p + j * vocab;
      ok = accept_u[j] * static_cast<double>(pj[x]) < static_cast<double>(qj[x]);
    }
    if (!ok) {
      if (greedy) {
        *next_token = argmax_row(qj, vocab);
      } else {
        residual_row(qj, p + j * vocab, vocab, scratch);
        *next_token = sample_probs(scratch, fin, vocab);
      }
      return j;
    }
    if (is_eos(x, eos, n_eos)) {
      *next_token = -1;
      return j + 1;
    }
  }
  const S* qb = q + len * vocab;
  *next_token = greedy ? argmax_row(qb, vocab) : sample_probs(qb, fin, vocab);
  return len;
}

}  // namespace specdec
