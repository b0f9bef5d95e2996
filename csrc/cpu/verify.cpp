// CPU adapters for the verifiers (spec §4.1, §8); kernels in specdec/verify.h.
#include <ATen/ops/empty.h>

#include <vector>

#include "cpu/common.h"
#include "cpu/ops.h"
#include "specdec/verify.h"

namespace specdec::cpu {
namespace {

// Compute dtype like the reference: float64 when any probability input is float64, else float32 (the
// conversions from bf16/fp16/fp32 are exact, so every comparison sees the reference's values).
at::ScalarType compute_type(const std::optional<at::Tensor>& p, const at::Tensor& q) {
  const bool f64 = q.scalar_type() == at::kDouble || (p.has_value() && p->scalar_type() == at::kDouble);
  return f64 ? at::kDouble : at::kFloat;
}

at::Tensor as_compute(const at::Tensor& t, at::ScalarType cd, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name, " must be floating, got ", t.scalar_type());
  return t.to(cd).contiguous();
}

template <typename S>
void chain_rows(const int64_t* draft, const S* p, const S* q, const int64_t* lengths, const double* u,
                const double* fin, bool greedy, const int64_t* eos, int64_t n_eos, int64_t batch, int64_t len_max,
                int64_t vocab, int64_t* n_acc, int64_t* next) {
#pragma omp parallel num_threads(omp_threads(batch, batch * vocab))
  {
    std::vector<S> scratch(vocab);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b)
      n_acc[b] = verify_chain_row<S>(draft + b * len_max, p == nullptr ? nullptr : p + b * len_max * vocab,
                                     q + b * (len_max + 1) * vocab, lengths[b], u + b * len_max, fin + b * vocab,
                                     greedy, eos, n_eos, vocab, scratch.data(), next + b);
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> verify_chain(const at::Tensor& draft_in, const std::optional<at::Tensor>& p_in,
                                                const at::Tensor& q_in, const at::Tensor& lengths_in,
                                                const at::Tensor& accept_u, const at::Tensor& final_noise, bool greedy,
                                                const std::optional<at::Tensor>& eos_in) {
  const at::Tensor draft = as_long(draft_in, "draft");
  const at::Tensor lengths = as_long(lengths_in, "lengths");
  TORCH_CHECK(draft.dim() == 2, "draft must be [B, L], got ", draft.sizes());
  const int64_t batch = draft.size(0), len_max = draft.size(1);
  TORCH_CHECK(q_in.dim() == 3 && q_in.size(0) == batch && q_in.size(1) == len_max + 1,
              "q must be [B, L+1, V] = [", batch, ", ", len_max + 1, ", V], got ", q_in.sizes());
  const int64_t vocab = q_in.size(2);
  TORCH_CHECK(vocab > 0, "q must have V > 0");
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "lengths must be [B=", batch, "]");
  TORCH_CHECK(greedy || p_in.has_value(), "p is required unless greedy");
  const at::ScalarType cd = compute_type(greedy ? std::nullopt : p_in, q_in);
  const at::Tensor q = as_compute(q_in, cd, "q");
  at::Tensor p;
  if (!greedy) {
    p = as_compute(*p_in, cd, "p");
    TORCH_CHECK(p.dim() == 3 && p.size(0) == batch && p.size(1) == len_max && p.size(2) == vocab,
                "p must be [B, L, V] = [", batch, ", ", len_max, ", ", vocab, "], got ", p.sizes());
  }
  check_cpu(accept_u, "accept_u");
  check_cpu(final_noise, "final_noise");
  const at::Tensor u = accept_u.to(at::kDouble).contiguous();
  const at::Tensor fin = final_noise.to(at::kDouble).contiguous();
  TORCH_CHECK(u.dim() == 2 && u.size(0) == batch && u.size(1) == len_max, "accept_u must be [B, L]");
  TORCH_CHECK(fin.dim() == 2 && fin.size(0) == batch && fin.size(1) == vocab, "final_noise must be [B, V]");
  at::Tensor eos;
  if (eos_in.has_value()) eos = as_long(*eos_in, "eos").reshape({-1});
  // Memory safety for direct torch.ops calls (the public op validates with friendlier messages).
  const int64_t* d = draft.const_data_ptr<int64_t>();
  const int64_t* lens = lengths.const_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= len_max, "lengths[", b, "] must be in [0, ", len_max, "]");
    for (int64_t j = 0; j < lens[b]; ++j)
      TORCH_CHECK(d[b * len_max + j] >= 0 && d[b * len_max + j] < vocab, "draft[", b, ", ", j,
                  "] must be a token id in [0, ", vocab, ")");
  }
  at::Tensor n_acc = at::empty({batch}, draft.options());
  at::Tensor next = at::empty({batch}, draft.options());
  const int64_t* e = eos.defined() ? eos.const_data_ptr<int64_t>() : nullptr;
  const int64_t n_eos = eos.defined() ? eos.numel() : 0;
  if (cd == at::kDouble) {
    chain_rows<double>(d, greedy ? nullptr : p.const_data_ptr<double>(), q.const_data_ptr<double>(), lens,
                       u.const_data_ptr<double>(), fin.const_data_ptr<double>(), greedy, e, n_eos, batch, len_max,
                       vocab, n_acc.mutable_data_ptr<int64_t>(), next.mutable_data_ptr<int64_t>());
  } else {
    chain_rows<float>(d, greedy ? nullptr : p.const_data_ptr<float>(), q.const_data_ptr<float>(), lens,
                      u.const_data_ptr<double>(), fin.const_data_ptr<double>(), greedy, e, n_eos, batch, len_max,
                      vocab, n_acc.mutable_data_ptr<int64_t>(), next.mutable_data_ptr<int64_t>());
  }
  return {n_acc, next};
}

}  // namespace specdec::cpu
