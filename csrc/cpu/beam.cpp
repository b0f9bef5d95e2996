// CPU adapters for the tree-drafting ops: spechub_sample, kseq_gamma, sbs_step; kernels in specdec/beam.h and
// specdec/verify.h.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>

#include <vector>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/beam.h"

namespace specdec::cpu {
namespace {

at::Tensor as_logp(const at::Tensor& logp, const char* name) {
  check_cpu(logp, name);
  TORCH_CHECK(at::isFloatingType(logp.scalar_type()), name, " must be floating, got ", logp.scalar_type());
  TORCH_CHECK(logp.dim() >= 1 && logp.size(-1) > 0, name, " must be [..., V] with V > 0, got ", logp.sizes());
  return widen(logp);
}

template <typename T>
void spechub_rows(const T* lp, const double* u, int64_t rows, int64_t vocab, int64_t* tok, int64_t* hub, bool* val) {
#pragma omp parallel for num_threads(omp_threads(rows, rows * vocab)) schedule(static)
  for (int64_t i = 0; i < rows; ++i)
    spechub_sample_row(lp + i * vocab, u + i * vocab, vocab, tok + 2 * i, hub + i, val + 2 * i);
}

template <typename S>
void kseq_rows(const S* p, const S* q, const int64_t* k, int64_t batch, int64_t vocab, double* gamma, double* beta) {
#pragma omp parallel for num_threads(omp_threads(batch, batch * vocab * 8)) schedule(dynamic, 1)
  for (int64_t b = 0; b < batch; ++b) kseq_gamma_row(p + b * vocab, q + b * vocab, vocab, k[b], gamma + b, beta + b);
}

// Parents of all rows in parallel (each writes its wsel candidates), then one selection per batch row.
template <typename T>
void sbs_rows(const T* lp, const double* sigma, const double* gamma, const bool* bvalid, const double* u,
              int64_t batch, int64_t w_in, int64_t vocab, int64_t w_out, int64_t* parent_slot, int64_t* tokens,
              double* sigma_out, double* gamma_out, bool* valid) {
  const int64_t wsel = w_out < vocab ? w_out : vocab;
  const int64_t n_cand = w_in * wsel;
  std::vector<BeamCand> cand(batch * n_cand);
  const int64_t parents = batch * w_in;
#pragma omp parallel num_threads(omp_threads(parents, parents * vocab))
  {
    BeamWork w;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < parents; ++r) {
      BeamCand* out = cand.data() + r * wsel;
      const int64_t slot = r % w_in;
      if (!bvalid[r]) {  // rows of invalid entries are never read
        for (int64_t j = 0; j < wsel; ++j) out[j] = {-INFINITY, slot * vocab + j, -INFINITY};
        continue;
      }
      sbs_parent(lp + r * vocab, u + r * vocab, vocab, sigma[r], gamma[r], wsel, slot, w, out);
    }
  }
  for (int64_t b = 0; b < batch; ++b)
    sbs_select(cand.data() + b * n_cand, n_cand, vocab, w_out, parent_slot + b * w_out, tokens + b * w_out,
               sigma_out + b * w_out, gamma_out + b * w_out, valid + b * w_out);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> spechub_sample(const at::Tensor& logp_in,
                                                              const std::optional<at::Tensor>& noise, int64_t seed) {
  const at::Tensor logp = as_logp(logp_in, "logp");
  const at::Tensor u = noise_or_philox(noise, logp_in.sizes(), seed, kDraftNoise, "noise");
  const int64_t vocab = logp.size(-1), rows = logp.numel() / vocab;
  std::vector<int64_t> lead(logp.sizes().begin(), logp.sizes().end() - 1);
  at::Tensor hub = at::empty(lead, logp.options().dtype(at::kLong));
  lead.push_back(2);
  at::Tensor tokens = at::empty(lead, logp.options().dtype(at::kLong));
  at::Tensor valid = at::empty(lead, logp.options().dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(logp.scalar_type(), "specdec_spechub_sample", [&] {
    spechub_rows(logp.const_data_ptr<scalar_t>(), u.const_data_ptr<double>(), rows, vocab,
                 tokens.mutable_data_ptr<int64_t>(), hub.mutable_data_ptr<int64_t>(), valid.mutable_data_ptr<bool>());
  });
  return {tokens, hub, valid};
}

std::tuple<at::Tensor, at::Tensor> kseq_gamma(const at::Tensor& p_in, const at::Tensor& q_in, const at::Tensor& k_in) {
  check_cpu(p_in, "p");
  check_cpu(q_in, "q");
  TORCH_CHECK(at::isFloatingType(p_in.scalar_type()) && at::isFloatingType(q_in.scalar_type()),
              "p and q must be floating, got ", p_in.scalar_type(), " and ", q_in.scalar_type());
  TORCH_CHECK(p_in.dim() == 2 && p_in.size(1) > 0, "p must be [B, V] with V > 0, got ", p_in.sizes());
  TORCH_CHECK(q_in.sizes() == p_in.sizes(), "q must have the shape of p ", p_in.sizes(), ", got ", q_in.sizes());
  const int64_t batch = p_in.size(0), vocab = p_in.size(1);
  const at::Tensor k = as_long(k_in, "k");
  TORCH_CHECK(k.dim() == 1 && k.size(0) == batch, "k must be [B=", batch, "], got ", k.sizes());
  // The reference sums in float64; float inputs are widened element by element (exact), bf16/fp16 by torch.
  const bool f64 = p_in.scalar_type() == at::kDouble || q_in.scalar_type() == at::kDouble;
  const at::ScalarType cd = f64 ? at::kDouble : at::kFloat;
  const at::Tensor p = p_in.to(cd).contiguous(), q = q_in.to(cd).contiguous();
  at::Tensor gamma = at::empty({batch}, p.options().dtype(at::kDouble));
  at::Tensor beta = at::empty({batch}, p.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(cd, "specdec_kseq_gamma", [&] {
    kseq_rows(p.const_data_ptr<scalar_t>(), q.const_data_ptr<scalar_t>(), k.const_data_ptr<int64_t>(), batch, vocab,
              gamma.mutable_data_ptr<double>(), beta.mutable_data_ptr<double>());
  });
  return {gamma, beta};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sbs_step(
    const at::Tensor& logp_in, const at::Tensor& sigma_in, const at::Tensor& gamma_in, const at::Tensor& beam_valid_in,
    int64_t w_out, const std::optional<at::Tensor>& noise, int64_t seed) {
  const at::Tensor logp = as_logp(logp_in, "logp");
  TORCH_CHECK(logp.dim() == 3, "logp must be [B, Win, V], got ", logp.sizes());
  const int64_t batch = logp.size(0), w_in = logp.size(1), vocab = logp.size(2);
  for (const at::Tensor* t : {&sigma_in, &gamma_in, &beam_valid_in}) {
    check_cpu(*t, "sigma/gamma/beam_valid");
    TORCH_CHECK(t->dim() == 2 && t->size(0) == batch && t->size(1) == w_in, "sigma, gamma and beam_valid must be [B=",
                batch, ", Win=", w_in, "], got ", t->sizes());
  }
  TORCH_CHECK(at::isFloatingType(sigma_in.scalar_type()) && at::isFloatingType(gamma_in.scalar_type()),
              "sigma and gamma must be floating");
  const at::Tensor sigma = sigma_in.to(at::kDouble).contiguous();
  const at::Tensor gamma = gamma_in.to(at::kDouble).contiguous();
  const at::Tensor bvalid = as_bool(beam_valid_in, "beam_valid");
  const at::Tensor u = noise_or_philox(noise, logp_in.sizes(), seed, kDraftNoise, "noise");
  TORCH_CHECK(w_out >= 1 && w_out <= w_in * vocab, "w_out must be in [1, Win*V=", w_in * vocab, "], got ", w_out);
  auto opts = logp.options();
  at::Tensor parent_slot = at::empty({batch, w_out}, opts.dtype(at::kLong));
  at::Tensor tokens = at::empty({batch, w_out}, opts.dtype(at::kLong));
  at::Tensor sigma_out = at::empty({batch, w_out}, opts.dtype(at::kDouble));
  at::Tensor gamma_out = at::empty({batch, w_out}, opts.dtype(at::kDouble));
  at::Tensor valid = at::empty({batch, w_out}, opts.dtype(at::kBool));
  AT_DISPATCH_FLOATING_TYPES(logp.scalar_type(), "specdec_sbs_step", [&] {
    sbs_rows(logp.const_data_ptr<scalar_t>(), sigma.const_data_ptr<double>(), gamma.const_data_ptr<double>(),
             bvalid.const_data_ptr<bool>(), u.const_data_ptr<double>(), batch, w_in, vocab, w_out,
             parent_slot.mutable_data_ptr<int64_t>(), tokens.mutable_data_ptr<int64_t>(),
             sigma_out.mutable_data_ptr<double>(), gamma_out.mutable_data_ptr<double>(),
             valid.mutable_data_ptr<bool>());
  });
  return {parent_slot, tokens, sigma_out, gamma_out, valid};
}

}  // namespace specdec::cpu
