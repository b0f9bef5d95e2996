// Sampling kernels: one row per call, raw pointers + sizes.
//
// Every Gumbel race computes the exact score of an element as the torch reference does, in double:
// (double)logp[v] + (-log(-log u[v])), and breaks ties to the lower index. Elements whose cheap upper bound
// (gumbel_upper) cannot reach the current k-th best score are skipped without evaluating logs; the skip test has a
// margin, so the decisions are exactly those of the full evaluation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <queue>
#include <type_traits>
#include <utility>
#include <vector>

#include "specdec/common.h"

namespace specdec {

constexpr int64_t kRaceChunk = 64;     // elements bounded together before any exact evaluation
constexpr double kSworMassEps = 1e-7;  // Gumbel-top-k: stop drawing once the remaining draft mass is this small

// Generic race: argmax_v score(v) + gumbel(u[v]) over v in [0, n), ties -> lowest v.
// score(v) is the exact double score without noise (may be -inf); bound(v) >= score(v) is cheap.
template <class Score, class Bound>
int64_t gumbel_argmax(int64_t n, const double* u, Score score, Bound bound) {
  int64_t best_i = 0;
  double best = score(0) + gumbel(u[0]);
  for (int64_t c = 1; c < n; c += kRaceChunk) {
    const int64_t end = std::min(n, c + kRaceChunk);
    const double thr = best - race_margin(best);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t v = c; v < end; ++v) any |= (bound(v) + gumbel_upper(u[v]) >= thr);
    if (!any) continue;
    for (int64_t v = c; v < end; ++v) {
      // the chunk passed as a whole; most of its elements still cannot reach the best (threshold only grows)
      if (bound(v) + gumbel_upper(u[v]) < best - race_margin(best)) continue;
      const double s = score(v);
      if (s == -INFINITY) continue;
      const double total = s + gumbel(u[v]);
      if (total > best) {
        best = total;
        best_i = v;
      }
    }
  }
  return best_i;
}

// Gumbel-max: token = argmax_v (double)logp[v] + G(u[v]).
// Exact double value of a log-prob element, as the reference's `logp.double()` (fp16/bf16 convert exactly).
template <typename T>
SPECDEC_HD double as_double(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return static_cast<double>(static_cast<float>(x));
  }
}

// Gumbel-max: token = argmax_v (double)logp[v] + G(u[v]).
template <typename T>
int64_t sample_categorical_row(const T* logp,    // [V]
                               const double* u,  // [V] uniforms in (0, 1)
                               int64_t vocab) {
  auto lp = [logp](int64_t v) { return as_double(logp[v]); };
  return gumbel_argmax(vocab, u, lp, lp);
}

// sample_categorical_row restricted to the m finite entries ids[0..m) (ascending) of a sparse row: the same exact
// scores in the same order, so the same winner (ties -> lower id); m = 0 returns 0 like the dense race.
template <typename T>
int64_t sample_categorical_sparse(const T* logp, const double* u, const int64_t* ids, int64_t m) {
  if (m == 0) return 0;
  int64_t best_i = ids[0];
  double best = as_double(logp[best_i]) + gumbel(u[best_i]);
  for (int64_t t = 1; t < m; ++t) {
    const int64_t v = ids[t];
    const double s = as_double(logp[v]);
    if (s + gumbel_upper(u[v]) < best - race_margin(best)) continue;
    const double total = s + gumbel(u[v]);
    if (total > best) {
      best = total;
      best_i = v;
    }
  }
  return best_i;
}

// Top-k race of one row: the k largest score(v) + gumbel(u[v]) over v in [0, n), descending, ties -> lower v.
// score(v) is the exact double score without noise (may be -inf); bound(v) >= score(v) is cheap. Small k keeps a
// sorted buffer in the outputs; larger k a binary heap (heap: [k] scratch) whose top is the worst kept candidate.
// Both skip chunks whose bounds cannot beat the current k-th best. Requires 1 <= k <= n.
constexpr int64_t kTopkBuffer = 64;

template <class Score, class Bound>
void race_topk(int64_t n, const double* u, int64_t k, Score score_of, Bound bound,
               int64_t* idx,    // [k] out, descending by perturbed score
               double* score,   // [k] out, the perturbed scores
               std::pair<double, int64_t>* heap) {  // [k] scratch, used when k > kTopkBuffer
  int64_t count = 0;
  if (k <= kTopkBuffer) {
    // sorted buffer of the best k so far; a later index never wins a tie, so it goes after equal scores
    for (int64_t c = 0; c < n; c += kRaceChunk) {
      const int64_t end = std::min(n, c + kRaceChunk);
      if (count == k) {
        const double thr = score[k - 1] - race_margin(score[k - 1]);
        int any = 0;
#pragma omp simd reduction(| : any)
        for (int64_t v = c; v < end; ++v) any |= (bound(v) + gumbel_upper(u[v]) >= thr);
        if (!any) continue;
      }
      for (int64_t v = c; v < end; ++v) {
        // per element too: the k-th best only grows, so an element whose bound misses it now never enters
        if (count == k && bound(v) + gumbel_upper(u[v]) < score[k - 1] - race_margin(score[k - 1])) continue;
        const double s = score_of(v) + gumbel(u[v]);
        if (count == k && !(s > score[k - 1])) continue;
        int64_t j = count < k ? count : k - 1;
        while (j > 0 && score[j - 1] < s) {
          score[j] = score[j - 1];
          idx[j] = idx[j - 1];
          --j;
        }
        score[j] = s;
        idx[j] = v;
        if (count < k) ++count;
      }
    }
    return;
  }
  // comp(a, b) = "a beats b": std's max-heap then keeps the worst kept candidate on top
  auto comp = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
    return beats(a.first, a.second, b.first, b.second);
  };
  for (int64_t c = 0; c < n; c += kRaceChunk) {
    const int64_t end = std::min(n, c + kRaceChunk);
    if (count == k) {
      const double thr = heap[0].first - race_margin(heap[0].first);
      int any = 0;
#pragma omp simd reduction(| : any)
      for (int64_t v = c; v < end; ++v) any |= (bound(v) + gumbel_upper(u[v]) >= thr);
      if (!any) continue;
    }
    for (int64_t v = c; v < end; ++v) {
      if (count == k && bound(v) + gumbel_upper(u[v]) < heap[0].first - race_margin(heap[0].first)) continue;
      const double s = score_of(v) + gumbel(u[v]);
      if (count < k) {
        heap[count++] = {s, v};
        std::push_heap(heap, heap + count, comp);
      } else if (s > heap[0].first) {  // a later index loses every tie
        std::pop_heap(heap, heap + k, comp);
        heap[k - 1] = {s, v};
        std::push_heap(heap, heap + k, comp);
      }
    }
  }
  std::sort_heap(heap, heap + k, comp);
  for (int64_t j = 0; j < k; ++j) {
    score[j] = heap[j].first;
    idx[j] = heap[j].second;
  }
}

// Gumbel-top-k of one row: the k largest perturbed scores, descending, ties -> lower token id; then
// candidate j is valid iff its score is finite and the draft mass left before it, computed as the reference does
// (sequential double cumsum of exp(logp) minus the candidate's own term), exceeds 1e-7.
template <typename T>
void gumbel_topk_row(const T* logp,    // [V]
                     const double* u,  // [V] uniforms in (0, 1)
                     int64_t vocab, int64_t k,
                     int64_t* tokens,  // [k] out, -1 where invalid
                     bool* valid,      // [k] out
                     double* score,    // [k] out, -inf where invalid
                     std::pair<double, int64_t>* heap) {  // [k] scratch, used when k > kTopkBuffer
  auto lp = [logp](int64_t v) { return as_double(logp[v]); };
  if (k == 0) return;
  race_topk(vocab, u, k, lp, lp, tokens, score, heap);
  double cum = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    bool ok = score[j] > -INFINITY;
    const double picked = ok ? ::exp(lp(tokens[j])) : 0.0;
    cum += picked;
    const double mass_before = cum - picked;
    ok = ok && (1.0 - mass_before) > kSworMassEps;
    valid[j] = ok;
    if (!ok) {
      tokens[j] = -1;
      score[j] = -INFINITY;
    }
  }
}

// First index v with at(v) == value (0 if none), chunk by chunk: a vectorised "any" per chunk, then a scan of the
// chunk that holds it. With value = the row maximum of a NaN-free row: the first maximum (ties -> lowest id, like
// torch.argmax).
template <typename S, typename F>
int64_t first_index_of(int64_t vocab, S value, F at) {
  for (int64_t c = 0; c < vocab; c += kRaceChunk) {
    const int64_t end = std::min(vocab, c + kRaceChunk);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t v = c; v < end; ++v) any |= at(v) == value;
    if (!any) continue;
    for (int64_t v = c; v < end; ++v)
      if (at(v) == value) return v;
  }
  return 0;
}

// ---- Philox streams on the CPU (the counter-based noise of specdec_kernels/_rng.py, vectorised) ----

// Round keys of Philox-4x32-10 for a seed, precomputed so that the rounds below vectorise.
struct PhiloxKeys {
  uint32_t a[10], b[10];
  explicit PhiloxKeys(uint64_t seed) {
    a[0] = static_cast<uint32_t>(seed);
    b[0] = static_cast<uint32_t>(seed >> 32);
    for (int r = 1; r < 10; ++r) {
      a[r] = a[r - 1] + 0x9E3779B9u;
      b[r] = b[r - 1] + 0xBB67AE85u;
    }
  }
};

// The 10 rounds of philox4x32_10 (common.h) on scalars, branch-free: loops over counters vectorise (AVX2/AVX-512
// 32x32->64 multiplies).
inline void philox_rounds(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, const PhiloxKeys& k) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k.a[r];
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k.b[r];
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
  }
}

// philox_u52 (common.h) with the integer->double conversion by the 2^52 bit trick (exact for m < 2^52), which
// vectorises without AVX-512DQ: (m + 0.5) 2^-52 = (2m + 1) 2^-53.
inline double philox_u52_bits(uint32_t a, uint32_t b) {
  const uint64_t bits = ((static_cast<uint64_t>(a >> 12) << 32) | b) | 0x4330000000000000ull;  // the double 2^52 + m
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return (d - 4503599627370496.0 + 0.5) * 2.220446049250313e-16;
}

// Philox uniforms (stream (seed, purpose), row `row`) for elements [lo, hi) of the row, lo even: one Philox call
// per element pair.
inline void philox_fill_span(double* out, int64_t lo, int64_t hi, uint64_t seed, uint32_t purpose, uint64_t row) {
  const PhiloxKeys keys(seed);
  const uint32_t r0 = static_cast<uint32_t>(row), r1 = static_cast<uint32_t>(row >> 32);
  const int64_t j0 = lo / 2, full = (hi - lo) / 2;  // pairs that lie entirely in [lo, hi)
  double* o = out + lo;
#pragma omp simd
  for (int64_t t = 0; t < full; ++t) {
    uint32_t c0 = static_cast<uint32_t>(j0 + t), c1 = r0, c2 = r1, c3 = purpose;
    philox_rounds(c0, c1, c2, c3, keys);
    o[2 * t] = philox_u52_bits(c0, c1);
    o[2 * t + 1] = philox_u52_bits(c2, c3);
  }
  if (lo + 2 * full < hi) out[hi - 1] = philox_uniform(seed, purpose, row, static_cast<uint64_t>(hi - 1));  // odd tail
}

// Philox uniforms of one row at the entries where keep(v) holds; the others are left unwritten unless fill_masked
// (then 0.5, which never matters: a masked entry's race score is -inf whatever the noise). Top-k/top-p laws and
// reduced-vocabulary drafts mask most of the vocabulary, so this draws a fraction of the row; dense rows fall back to
// the pairwise fill. idx: scratch. Returns the number m of kept entries when the row was sparse (idx[0..m) then lists
// them in increasing order), -1 when it was filled densely.
template <typename Keep>
int64_t philox_fill_where(double* out, int64_t n, uint64_t seed, uint32_t purpose, uint64_t row,
                          std::vector<int64_t>& idx, bool fill_masked, Keep keep) {
  idx.resize(n);
  int64_t m = 0;
  for (int64_t c = 0; c < n; c += kRaceChunk) {  // chunks with nothing kept are skipped after one vector test
    const int64_t end = std::min(n, c + kRaceChunk);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t v = c; v < end; ++v) any |= keep(v) ? 1 : 0;
    if (!any) continue;
    for (int64_t v = c; v < end; ++v) {  // branch-free compaction
      idx[m] = v;
      m += keep(v) ? 1 : 0;
    }
  }
  if (3 * m > n) {  // one Philox call per element below vs one per pair here
    philox_fill_span(out, 0, n, seed, purpose, row);
    return -1;
  }
  if (fill_masked) std::fill(out, out + n, 0.5);  // a caller that reads only idx[0..m) skips this write
  const PhiloxKeys keys(seed);
  const uint32_t r0 = static_cast<uint32_t>(row), r1 = static_cast<uint32_t>(row >> 32);
  const int64_t* ids = idx.data();
#pragma omp simd
  for (int64_t t = 0; t < m; ++t) {
    const int64_t v = ids[t];
    uint32_t c0 = static_cast<uint32_t>(v >> 1), c1 = r0, c2 = r1, c3 = purpose;
    philox_rounds(c0, c1, c2, c3, keys);
    out[v] = (v & 1) ? philox_u52_bits(c2, c3) : philox_u52_bits(c0, c1);
  }
  return m;
}

// philox_fill_where at the finite entries of a log-prob row.
template <typename T>
int64_t philox_fill_finite(double* out, const T* lp, int64_t n, uint64_t seed, uint32_t purpose, uint64_t row,
                           std::vector<int64_t>& idx, bool fill_masked = true) {
  return philox_fill_where(out, n, seed, purpose, row, idx, fill_masked,
                           [lp](int64_t v) { return static_cast<double>(lp[v]) != -INFINITY; });
}

// ---- process_logits: temperature -> top-k -> top-p -> fp32 log-softmax ----

// Top-k: the k-th largest value (with multiplicity) of x; top_k_row then sets x[v] < kth to -inf (boundary ties
// kept). Small k: a min-heap of the k largest, fed only by chunks that hold something above its minimum.
inline float top_k_threshold(const float* x, int64_t vocab, int64_t k, std::vector<float>& scratch) {
  if (k > 1024) {
    scratch.assign(x, x + vocab);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
    return scratch[k - 1];
  }
  std::priority_queue<float, std::vector<float>, std::greater<float>> heap;
  for (int64_t c = 0; c < vocab; c += kRaceChunk) {
    const int64_t end = std::min(vocab, c + kRaceChunk);
    if (static_cast<int64_t>(heap.size()) == k) {
      const float lo = heap.top();
      int any = 0;
#pragma omp simd reduction(| : any)
      for (int64_t v = c; v < end; ++v) any |= x[v] > lo;
      if (!any) continue;
    }
    for (int64_t v = c; v < end; ++v) {
      if (static_cast<int64_t>(heap.size()) < k) {
        heap.push(x[v]);
      } else if (x[v] > heap.top()) {
        heap.pop();
        heap.push(x[v]);
      }
    }
  }
  return heap.top();
}

inline void top_k_row(float* x, int64_t vocab, int64_t k, std::vector<float>& scratch) {
  const float kth = top_k_threshold(x, vocab, k, scratch);
  for (int64_t v = 0; v < vocab; ++v) x[v] = x[v] >= kth ? x[v] : -INFINITY;
}

// Top-k and the final (log-)softmax of a row in one go, visiting only the kept entries after the threshold: a row
// keeps about k of its V entries, so the exp and the division run k times instead of V, and the rest of the row is
// one store of -inf (log) or 0. The kept set is top_k_row's; the sum runs over the kept entries in index order in
// double, without the dropped entries' exact zeros. mx: the row maximum, which top-k keeps.
inline void top_k_softmax_row(float* x, int64_t vocab, int64_t k, float mx, bool log, std::vector<float>& scratch,
                              std::vector<std::pair<int64_t, float>>& kept) {
  const float kth = top_k_threshold(x, vocab, k, scratch);
  kept.clear();
  for (int64_t c = 0; c < vocab; c += kRaceChunk) {
    const int64_t end = std::min(vocab, c + kRaceChunk);
    int any = 0;
#pragma omp simd reduction(| : any)
    for (int64_t v = c; v < end; ++v) any |= x[v] >= kth;
    if (!any) continue;
    for (int64_t v = c; v < end; ++v)
      if (x[v] >= kth && x[v] != -INFINITY) kept.emplace_back(v, x[v]);
  }
  double sum = 0.0;
  for (auto& [v, xv] : kept) {
    const float e = exp_nonpos(xv - mx);
    sum += static_cast<double>(e);
    if (!log) xv = e;
  }
  const float off = log ? -INFINITY : 0.0f;
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) x[v] = off;
  if (log) {
    const float lse = static_cast<float>(::log(sum));
    for (const auto& [v, xv] : kept) x[v] = (xv - mx) - lse;
  } else {
    const float s = static_cast<float>(sum);
    for (const auto& [v, e] : kept) x[v] = e / s;
  }
}

// Top-p on fp32 probabilities (bitwise those of the reference's fp32 softmax of x): keep the shortest prefix of the
// stable descending order whose double cumulative mass reaches top_p (a token is kept iff the mass before it is
// < top_p; the first always), then x[v] = -inf outside it. The cumulative sum runs in the same order and precision
// as the reference's cumsum, so the kept set is identical. Only the head of the order is sorted: tokens are
// bucketed by binary exponent and whole buckets are added (largest first) until the prefix is decided.
inline void top_p_row(float* x, const float* probs, int64_t vocab, double top_p,
                      std::vector<std::pair<float, int64_t>>& cand) {
  double bucket_mass[256] = {0.0};
  int64_t bucket_count[256] = {0};
  for (int64_t v = 0; v < vocab; ++v) {
    const uint32_t b = bits_of(probs[v]) >> 23;
    bucket_mass[b] += static_cast<double>(probs[v]);
    ++bucket_count[b];
  }
  int bucket = 255;
  double head = 0.0;
  while (bucket > 0 && head + bucket_mass[bucket] < top_p) head += bucket_mass[bucket--];
  while (bucket > 0 && bucket_count[bucket] == 0) --bucket;
  // candidates: every token in buckets >= bucket; extend one bucket at a time if their prefix falls short
  cand.clear();
  double mass_before = 0.0;
  int64_t done = 0;  // candidates already consumed by the cumulative walk
  int64_t last = -1;
  float last_p = 0.0f;
  int hi = 256;
  while (true) {
    const size_t start = cand.size();
    for (int64_t v = 0; v < vocab; ++v) {
      const int b = static_cast<int>(bits_of(probs[v]) >> 23);
      if (b >= bucket && b < hi) cand.emplace_back(probs[v], v);
    }
    std::sort(cand.begin() + start, cand.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    bool decided = false;
    for (; done < static_cast<int64_t>(cand.size()); ++done) {
      if (done > 0 && !(mass_before < top_p)) {
        decided = true;
        break;
      }
      last = cand[done].second;
      last_p = cand[done].first;
      mass_before += static_cast<double>(cand[done].first);
    }
    if (decided || bucket == 0) break;
    hi = bucket;
    --bucket;
    while (bucket > 0 && bucket_count[bucket] == 0) --bucket;
  }
  // kept = every token ordered before or at `last` in (p desc, index asc)
  for (int64_t v = 0; v < vocab; ++v) {
    const bool keep = probs[v] > last_p || (probs[v] == last_p && v <= last);
    x[v] = keep ? x[v] : -INFINITY;
  }
}

// In-place fp32 log-softmax of one row: (x - max) - log(sum exp(x - max)) with a double sum; -inf stays -inf.
inline float row_max(const float* x, int64_t vocab) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < vocab; ++v) mx = x[v] > mx ? x[v] : mx;
  return mx;
}

// sum_v exp(x[v] - mx): fp32 partial sums over short chunks (vectorised), accumulated in double
inline double sum_exp_row(const float* x, int64_t vocab, float mx) {
  double sum = 0.0;
  for (int64_t c = 0; c < vocab; c += 256) {
    const int64_t end = std::min(vocab, c + 256);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t v = c; v < end; ++v) part += exp_nonpos(x[v] - mx);
    sum += static_cast<double>(part);
  }
  return sum;
}

// mx: the row maximum (row_max), when the caller already has it
inline void log_softmax_row(float* x, int64_t vocab, float mx) {
  // (x - max) first: exact for the top tokens, so the only rounding left is that of the small log-sum
  const float lse = static_cast<float>(::log(sum_exp_row(x, vocab, mx)));
  for (int64_t v = 0; v < vocab; ++v) x[v] = (x[v] - mx) - lse;
}

inline void log_softmax_row(float* x, int64_t vocab) { log_softmax_row(x, vocab, row_max(x, vocab)); }

// The law itself (process_logits(log=False)): exp(x - max) / sum, 0 where x = -inf. One pass fewer than a
// log-softmax followed by a softmax, which is what a verifier that reads probabilities would otherwise need.
inline void softmax_row(float* x, int64_t vocab, float mx) {
  // exp once: the terms are stored while they are summed (masked -inf -> exactly 0), then divided by the sum
  double sum = 0.0;
  for (int64_t c = 0; c < vocab; c += 256) {
    const int64_t end = std::min(vocab, c + 256);
    float part = 0.0f;
#pragma omp simd reduction(+ : part)
    for (int64_t v = c; v < end; ++v) {
      const float e = x[v] == -INFINITY ? 0.0f : exp_nonpos(x[v] - mx);
      x[v] = e;
      part += e;
    }
    sum += static_cast<double>(part);
  }
  const float s = static_cast<float>(sum);
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) x[v] = x[v] / s;
}

inline void softmax_row(float* x, int64_t vocab) { softmax_row(x, vocab, row_max(x, vocab)); }

}  // namespace specdec
