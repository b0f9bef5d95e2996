// CPU adapters for the sampling ops; kernels in specdec/sampling.h.
#include <ATen/Dispatch.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/empty.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/sampling.h"

namespace specdec::cpu {
namespace {

// Rows of a [..., V] float tensor and its float64 noise, both contiguous; without a noise tensor the rows draw
// their Philox noise themselves (noise_row).
struct Rows {
  at::Tensor data, noise;
  int64_t rows, vocab;
  uint64_t seed;
  const double* u() const { return noise.defined() ? noise.const_data_ptr<double>() : nullptr; }
};

Rows as_rows(const at::Tensor& logp, const std::optional<at::Tensor>& noise, int64_t seed) {
  check_cpu(logp, "logp");
  TORCH_CHECK(at::isFloatingType(logp.scalar_type()), "logp must be floating, got ", logp.scalar_type());
  TORCH_CHECK(logp.dim() >= 1 && logp.size(-1) > 0, "logp must be [..., V] with V > 0, got ", logp.sizes());
  TORCH_CHECK(seed >= 0, "seed must be >= 0, got ", seed);
  const int64_t vocab = logp.size(-1);
  at::Tensor u;
  if (noise.has_value()) u = noise_or_philox(noise, logp.sizes(), seed, kDraftNoise, "noise");
  return {widen(logp), u, logp.numel() / vocab, vocab, static_cast<uint64_t>(seed)};
}

// Noise of row i: the caller's, or the row's Philox stream drawn into this thread's scratch (finite entries only).
template <typename T>
const double* noise_row(const double* u, const T* lp, int64_t vocab, int64_t i, uint64_t seed,
                        std::vector<double>& scratch, std::vector<int64_t>& idx) {
  if (u != nullptr) return u + i * vocab;
  if (static_cast<int64_t>(scratch.size()) < vocab) scratch.resize(vocab);
  philox_fill_finite(scratch.data(), lp, vocab, seed, kDraftNoise, static_cast<uint64_t>(i), idx);
  return scratch.data();
}

std::vector<int64_t> lead_shape(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end() - 1);
  if (last >= 0) shape.push_back(last);
  return shape;
}

template <typename T>
void sample_rows(const T* lp, const double* u, uint64_t seed, int64_t rows, int64_t vocab, int64_t* out) {
#pragma omp parallel num_threads(omp_threads(rows, rows * vocab))
  {
    // scratch kept by the thread across calls (sizing it per call would clear V entries every time)
    thread_local std::vector<double> scratch;
    thread_local std::vector<int64_t> idx;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = lp + i * vocab;
      if (u == nullptr) {
        if (static_cast<int64_t>(scratch.size()) < vocab) scratch.resize(vocab);
        const int64_t m =
            philox_fill_finite(scratch.data(), row, vocab, seed, kDraftNoise, static_cast<uint64_t>(i), idx, false);
        // a sparse row (a reduced-head draft, top-k/top-p): race over its finite entries only, same scores and order
        out[i] = m >= 0 ? sample_categorical_sparse(row, scratch.data(), idx.data(), m)
                        : sample_categorical_row(row, scratch.data(), vocab);
        continue;
      }
      out[i] = sample_categorical_row(row, u + i * vocab, vocab);
    }
  }
}

template <typename T>
void topk_rows(const T* lp, const double* u, uint64_t seed, int64_t rows, int64_t vocab, int64_t k, int64_t* tok,
               bool* val, double* sc) {
#pragma omp parallel num_threads(omp_threads(rows, rows * vocab))
  {
    std::vector<std::pair<double, int64_t>> heap(k > kTopkBuffer ? k : 0);
    thread_local std::vector<double> scratch;  // kept across calls, as in sample_rows
    thread_local std::vector<int64_t> idx;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const T* row = lp + i * vocab;
      const double* ui = noise_row(u, row, vocab, i, seed, scratch, idx);
      gumbel_topk_row(row, ui, vocab, k, tok + i * k, val + i * k, sc + i * k, heap.data());
    }
  }
}

// Element v of a row as fp32 (exact for every input dtype but double, which rounds like the reference's .float());
// bf16 becomes the top half of a float: a shift the loops vectorise.
template <typename T>
inline float load_elem(const T* x, int64_t v) {
  return static_cast<float>(x[v]);
}
template <>
inline float load_elem<c10::BFloat16>(const c10::BFloat16* x, int64_t v) {
  return float_of(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(x)[v]) << 16);
}

// The value checks of the public op (ops._checks.check_logp), made here in the first pass over the input instead
// of in a separate widening copy and reduction: a row holding NaN, holding +inf, or with every entry -inf.
enum RowStatus : uint8_t { kRowOk = 0, kRowNaN = 1, kRowPosInf = 2, kRowAllNegInf = 3, kRowOverflow = 4 };

inline uint8_t row_status(float raw_max, int nan) {
  if (nan) return kRowNaN;
  if (raw_max == INFINITY) return kRowPosInf;
  if (raw_max == -INFINITY) return kRowAllNegInf;
  return kRowOk;
}

// Greedy rows: the checks and the row maximum in one vectorised pass; first_index_of then finds the first index
// holding it (the checks exclude NaN, so `==` finds it).
template <typename T>
uint8_t check_row(const T* x, int64_t vocab, float* raw_max) {
  float mx = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t v = 0; v < vocab; ++v) {
    const float w = load_elem(x, v);
    nan |= w != w;
    mx = w > mx ? w : mx;
  }
  *raw_max = mx;
  return row_status(mx, nan);
}

// out = fp32(x) / T (one IEEE division per element, like the reference's `x.float() / T`), the row's checks and
// its maximum after the division, in one pass over the input in its own dtype. Division by T > 0 is monotone
// after rounding, so max(x / T) = max(x) / T exactly.
template <typename T>
uint8_t scale_row(const T* x, int64_t vocab, float temperature, float* out, float* scaled_max) {
  float mx = -INFINITY;
  int nan = 0;
#pragma omp simd reduction(max : mx) reduction(| : nan)
  for (int64_t v = 0; v < vocab; ++v) {
    const float w = load_elem(x, v);
    out[v] = w / temperature;
    nan |= w != w;
    mx = w > mx ? w : mx;
  }
  *scaled_max = mx / temperature;
  const uint8_t status = row_status(mx, nan);
  // a finite maximum that the division takes to +inf would make the row's softmax NaN
  return status == kRowOk && *scaled_max == INFINITY ? kRowOverflow : status;
}

// Greedy rows, or temperature + top-k (+ the final log-softmax when there is no top-p step). A row that fails
// its checks is left unprocessed (status[i] != kRowOk); the caller raises before anything reads it.
template <typename T>
void first_pass_rows(const T* x, int64_t rows, int64_t vocab, bool greedy, float temperature, int64_t top_k,
                     bool finish, bool log, float* out, uint8_t* status) {
#pragma omp parallel num_threads(omp_threads(rows, rows * vocab))
  {
    std::vector<float> scratch;
    std::vector<std::pair<int64_t, float>> kept;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      float* row = out + i * vocab;
      if (greedy) {  // the one-hot law of argmax (log: 0 there, -inf elsewhere), never dividing by T
        float mx;
        status[i] = check_row(x + i * vocab, vocab, &mx);
        if (status[i] != kRowOk) continue;
        const T* xi = x + i * vocab;
        const int64_t best = first_index_of(vocab, mx, [xi](int64_t v) { return load_elem(xi, v); });
        const float off = log ? -INFINITY : 0.0f;
#pragma omp simd
        for (int64_t v = 0; v < vocab; ++v) row[v] = off;
        row[best] = log ? 0.0f : 1.0f;
        continue;
      }
      float mx;
      status[i] = scale_row(x + i * vocab, vocab, temperature, row, &mx);
      if (status[i] != kRowOk) continue;
      if (top_k > 0 && finish) {  // the kept entries alone get the exp (top_k_softmax_row)
        top_k_softmax_row(row, vocab, top_k, mx, log, scratch, kept);
        continue;
      }
      if (top_k > 0) top_k_row(row, vocab, top_k, scratch);  // keeps the k largest, so the maximum stays
      if (finish) {
        if (log)
          log_softmax_row(row, vocab, mx);
        else
          softmax_row(row, vocab, mx);
      }
    }
  }
}

// The public op's errors, in its order: NaN anywhere, then +inf anywhere, then a row with every entry -inf.
void raise_bad_rows(const std::vector<uint8_t>& status) {
  uint8_t worst = kRowOk;
  for (const uint8_t s : status)
    if (s != kRowOk && (worst == kRowOk || s < worst)) worst = s;
  TORCH_CHECK_VALUE(worst != kRowNaN, "logits contains NaN; NaN logits are rejected, fix the model output upstream");
  TORCH_CHECK_VALUE(worst != kRowPosInf, "logits contains +inf; only -inf (masked token) is allowed");
  TORCH_CHECK_VALUE(worst != kRowAllNegInf,
                    "logits has a row where every entry is -inf (no token can be sampled)");
  TORCH_CHECK_VALUE(worst != kRowOverflow,
                    "logits / temperature overflows float32 to +inf: logits this large cannot be scaled by this "
                    "temperature");
}

}  // namespace

at::Tensor sample_categorical(const at::Tensor& logp, const std::optional<at::Tensor>& noise, int64_t seed) {
  const Rows r = as_rows(logp, noise, seed);
  at::Tensor out = at::empty(lead_shape(logp, -1), logp.options().dtype(at::kLong));
  int64_t* o = out.mutable_data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES(r.data.scalar_type(), "specdec_sample_categorical", [&] {
    sample_rows(r.data.const_data_ptr<scalar_t>(), r.u(), r.seed, r.rows, r.vocab, o);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gumbel_topk(const at::Tensor& logp, int64_t k,
                                                           const std::optional<at::Tensor>& noise, int64_t seed) {
  const Rows r = as_rows(logp, noise, seed);
  TORCH_CHECK(k >= 0 && k <= r.vocab, "k must be in [0, V=", r.vocab, "], got ", k);
  const auto shape = lead_shape(logp, k);
  at::Tensor tokens = at::empty(shape, logp.options().dtype(at::kLong));
  at::Tensor valid = at::empty(shape, logp.options().dtype(at::kBool));
  at::Tensor score = at::empty(shape, logp.options().dtype(at::kDouble));
  int64_t* tok = tokens.mutable_data_ptr<int64_t>();
  bool* val = valid.mutable_data_ptr<bool>();
  double* sc = score.mutable_data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(r.data.scalar_type(), "specdec_gumbel_topk", [&] {
    topk_rows(r.data.const_data_ptr<scalar_t>(), r.u(), r.seed, r.rows, r.vocab, k, tok, val, sc);
  });
  return {tokens, valid, score};
}

at::Tensor process_logits(const at::Tensor& logits_in, double temperature, int64_t top_k, double top_p, bool log) {
  check_cpu(logits_in, "logits");
  TORCH_CHECK(at::isFloatingType(logits_in.scalar_type()), "logits must be floating, got ",
              logits_in.scalar_type());
  TORCH_CHECK(logits_in.dim() >= 1 && logits_in.size(-1) > 0, "logits must be [..., V] with V > 0");
  TORCH_CHECK(temperature >= 0.0, "temperature must be >= 0, got ", temperature);
  TORCH_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  TORCH_CHECK(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got ", top_p);
  const at::Tensor logits = logits_in.contiguous();  // bf16/fp16 are widened element by element (scale_row)
  const int64_t vocab = logits.size(-1), rows = logits.numel() / vocab;
  at::Tensor out = at::empty(logits.sizes(), logits.options().dtype(at::kFloat));
  float* o = out.mutable_data_ptr<float>();
  const bool greedy = temperature < 1e-5;  // ops.sampling.GREEDY_TEMPERATURE
  const bool use_top_k = top_k > 0 && top_k < vocab;
  const bool use_top_p = top_p < 1.0;
  std::vector<uint8_t> status(rows, kRowOk);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, logits.scalar_type(), "specdec_process_logits", [&] {
    first_pass_rows(logits.const_data_ptr<scalar_t>(), rows, vocab, greedy, static_cast<float>(temperature),
                    use_top_k ? top_k : 0, !use_top_p, log, o, status.data());
  });
  raise_bad_rows(status);
  if (greedy || !use_top_p) return out;
  // The top-p boundary compares a cumulative sum of fp32 probabilities with top_p; computing them with torch's own
  // softmax kernel keeps them bitwise equal to the reference's, so the kept set is identical (a different exp or
  // summation order would move the boundary in a noticeable fraction of large-vocabulary rows).
  const at::Tensor probs = at::_softmax(out, -1, false);
  const float* p = probs.const_data_ptr<float>();
#pragma omp parallel num_threads(omp_threads(rows, rows * vocab))
  {
    std::vector<std::pair<float, int64_t>> cand;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      top_p_row(o + i * vocab, p + i * vocab, vocab, top_p, cand);
      if (log)
        log_softmax_row(o + i * vocab, vocab);
      else
        softmax_row(o + i * vocab, vocab);
    }
  }
  return out;
}

}  // namespace specdec::cpu
