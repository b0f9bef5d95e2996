// CPU adapters for the verifiers; kernels in specdec/verify.h.
#include <ATen/ops/empty.h>

#include <string>
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

// The final sample's noise: the caller's uniforms, or none (the kernels then draw the Philox stream of `seed`
// themselves, only where the sampled law has mass: FinalNoise in specdec/verify.h).
at::Tensor final_uniforms(const std::optional<at::Tensor>& final_noise, at::IntArrayRef shape, int64_t seed) {
  TORCH_CHECK(seed >= 0, "seed must be >= 0, got ", seed);
  return final_noise.has_value() ? noise_or_philox(final_noise, shape, seed, kFinalNoise, "final_noise") : at::Tensor();
}

// Row b's FinalNoise of a call: fin [B, V] or null (the stream of seed, row b).
inline void final_row(FinalNoise& f, const double* fin, int64_t seed, int64_t b, int64_t vocab) {
  f.u = fin == nullptr ? nullptr : fin + b * vocab;
  f.seed = static_cast<uint64_t>(seed);
  f.row = static_cast<uint64_t>(b);
}

inline const double* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr<double>() : nullptr; }

template <typename S>
void chain_rows(const int64_t* draft, const S* p, const S* q, const int64_t* lengths, const double* u,
                const double* fin, int64_t seed, bool greedy, const int64_t* eos, int64_t n_eos, int64_t batch,
                int64_t len_max, int64_t vocab, int64_t* n_acc, int64_t* next, double leniency) {
#pragma omp parallel num_threads(omp_threads(batch, batch * vocab))
  {
    std::vector<S> scratch(vocab);
    FinalNoise f;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
      final_row(f, fin, seed, b, vocab);
      n_acc[b] = verify_chain_row<S>(draft + b * len_max, p == nullptr ? nullptr : p + b * len_max * vocab,
                                     q + b * (len_max + 1) * vocab, lengths[b], u + b * len_max, f, greedy, eos,
                                     n_eos, vocab, scratch.data(), next + b, leniency);
    }
  }
}

template <typename S>
void emission_rows(const S* p, const S* q, int64_t rows, int64_t vocab, double leniency, S* out) {
#pragma omp parallel for num_threads(omp_threads(rows, rows * vocab)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) emission_law_row<S>(p + r * vocab, q + r * vocab, vocab, leniency, out + r * vocab);
}

Method method_of(const std::string& name) {
  Method m;
  TORCH_CHECK(parse_method(name, &m),
              "method must be one of sd, rrs, rrsw, kseq, spechub, block, traversal, traversalw, got '", name, "'");
  return m;
}

template <typename S>
void node_rows(Method method, const int64_t* cand, const bool* cand_valid, const S* p, const S* q, const double* u,
               const double* fin, int64_t seed, const int64_t* hub, int64_t batch, int64_t k, int64_t vocab,
               int64_t* slot, int64_t* token, S* accept_prob, S* final_out) {
#pragma omp parallel num_threads(omp_threads(batch, batch * vocab * (k + 1)))
  {
    NodeWork<S> w(vocab);
    std::vector<int64_t> slots, toks;
    FinalNoise f;
#pragma omp for schedule(static)
    for (int64_t b = 0; b < batch; ++b) {
      final_row(f, fin, seed, b, vocab);
      verify_node_row<S>(method, cand + b * k, cand_valid + b * k, k, p + b * vocab, q + b * vocab, u + b * k, f,
                         hub ? hub[b] : -1, vocab, w, slots, toks, slot + b, token + b, accept_prob + b * k,
                         final_out + b * vocab);
    }
  }
}

template <typename S>
void tree_rows(const int64_t* tokens, const int64_t* parent, const bool* valid, const S* p, const S* q,
               Method method, const int64_t* hub, const double* u, const double* fin, int64_t seed, bool greedy,
               const int64_t* eos, int64_t n_eos, int64_t batch, int64_t n, int64_t vocab, int64_t ku,
               int64_t max_depth,
               int64_t* acc_nodes, int64_t* n_acc, int64_t* next, int64_t* acc_rank) {
  bool ok = true;
#pragma omp parallel num_threads(omp_threads(batch, batch * vocab * 4))
  {
    NodeWork<S> w(greedy ? 0 : vocab);
    TreeWork t;
    FinalNoise f;
#pragma omp for schedule(dynamic, 1) reduction(&& : ok)
    for (int64_t b = 0; b < batch; ++b) {
      final_row(f, fin, seed, b, vocab);
      n_acc[b] = verify_tree_row<S>(tokens + b * n, parent + b * n, valid + b * n,
                                    p == nullptr ? nullptr : p + b * n * vocab, q + b * n * vocab, method,
                                    hub == nullptr ? nullptr : hub + b * n, u + b * n * ku, f, greedy, eos, n_eos, n,
                                    vocab, ku, max_depth, w, t, acc_nodes + b * max_depth, acc_rank + b * max_depth,
                                    next + b);
      ok = ok && n_acc[b] >= 0;
    }
  }
  TORCH_CHECK(ok, "verify_tree: a walk needed more acceptance uniforms than accept_u.shape[2] or a path longer than "
              "max_depth; pass the tree's real maximum sibling count and depth");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_node(
    const std::string& method_name, const at::Tensor& cand_in, const at::Tensor& cand_valid_in, const at::Tensor& p_in,
    const at::Tensor& q_in, const std::optional<at::Tensor>& accept_u, const std::optional<at::Tensor>& final_noise,
    const std::optional<at::Tensor>& hub_in, int64_t seed) {
  const Method method = method_of(method_name);
  TORCH_CHECK(method != Method::kBlock && method != Method::kTraversal && method != Method::kTraversalW, "method '",
              method_name, "' verifies paths (verify_tree), not single nodes");
  const at::Tensor cand = as_long(cand_in, "cand");
  const at::Tensor cand_valid = as_bool(cand_valid_in, "cand_valid");
  TORCH_CHECK(cand.dim() == 2, "cand must be [B, K], got ", cand.sizes());
  const int64_t batch = cand.size(0), k = cand.size(1);
  TORCH_CHECK(cand_valid.sizes() == cand.sizes(), "cand_valid must have the shape of cand");
  const at::ScalarType cd = compute_type(p_in, q_in);
  const at::Tensor p = as_compute(p_in, cd, "p");
  const at::Tensor q = as_compute(q_in, cd, "q");
  TORCH_CHECK(p.dim() == 2 && p.size(0) == batch && p.size(1) > 0, "p must be [B, V], got ", p.sizes());
  const int64_t vocab = p.size(1);
  TORCH_CHECK(q.sizes() == p.sizes(), "q must have the shape of p ", p.sizes(), ", got ", q.sizes());
  const at::Tensor u = noise_or_philox(accept_u, cand.sizes(), seed, kAcceptNoise, "accept_u");
  const at::Tensor fin = final_uniforms(final_noise, p.sizes(), seed);
  at::Tensor hub;
  if (hub_in.has_value()) {
    hub = as_long(*hub_in, "hub");
    TORCH_CHECK(hub.dim() == 1 && hub.size(0) == batch, "hub must be [B]");
  }
  TORCH_CHECK(method != Method::kSpecHub || hub.defined(), "method 'spechub' needs hub");
  // Memory safety for direct torch.ops calls (the public op validates with friendlier messages).
  const int64_t* c = cand.const_data_ptr<int64_t>();
  const bool* cv = cand_valid.const_data_ptr<bool>();
  for (int64_t b = 0; b < batch; ++b) {
    int64_t n_valid = 0;
    for (int64_t j = 0; j < k; ++j) {
      if (!cv[b * k + j]) continue;
      ++n_valid;
      TORCH_CHECK(c[b * k + j] >= 0 && c[b * k + j] < vocab, "cand[", b, ", ", j, "] must be in [0, ", vocab, ")");
    }
    if (method == Method::kSpecHub) {
      const int64_t a = hub.const_data_ptr<int64_t>()[b];
      TORCH_CHECK(a >= 0 && a < vocab, "hub[", b, "] must be in [0, ", vocab, ")");
      TORCH_CHECK(n_valid >= 1 && n_valid <= 2, "spechub needs 1 or 2 valid candidates per row");
    }
  }
  at::Tensor slot = at::empty({batch}, cand.options());
  at::Tensor token = at::empty({batch}, cand.options());
  at::Tensor accept_prob = at::empty({batch, k}, p.options());
  at::Tensor final_out = at::empty({batch, vocab}, p.options());
  const int64_t* h = hub.defined() ? hub.const_data_ptr<int64_t>() : nullptr;
  if (cd == at::kDouble) {
    node_rows<double>(method, c, cv, p.const_data_ptr<double>(), q.const_data_ptr<double>(),
                      u.const_data_ptr<double>(), data_or_null(fin), seed, h, batch, k, vocab,
                      slot.mutable_data_ptr<int64_t>(), token.mutable_data_ptr<int64_t>(),
                      accept_prob.mutable_data_ptr<double>(), final_out.mutable_data_ptr<double>());
  } else {
    node_rows<float>(method, c, cv, p.const_data_ptr<float>(), q.const_data_ptr<float>(), u.const_data_ptr<double>(),
                     data_or_null(fin), seed, h, batch, k, vocab, slot.mutable_data_ptr<int64_t>(),
                     token.mutable_data_ptr<int64_t>(), accept_prob.mutable_data_ptr<float>(),
                     final_out.mutable_data_ptr<float>());
  }
  return {slot, token, accept_prob, final_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> verify_tree(
    const at::Tensor& tokens_in, const at::Tensor& parent_in, const at::Tensor& valid_in,
    const std::optional<at::Tensor>& p_in, const at::Tensor& q_in, const std::string& method_name,
    const std::optional<at::Tensor>& hub_in, const std::optional<at::Tensor>& accept_u,
    const std::optional<at::Tensor>& final_noise, bool greedy, const std::optional<at::Tensor>& eos_in, int64_t max_depth,
    int64_t seed) {
  const Method method = method_of(method_name);
  const at::Tensor tokens = as_long(tokens_in, "tokens");
  const at::Tensor parent = as_long(parent_in, "parent");
  const at::Tensor valid = as_bool(valid_in, "valid");
  TORCH_CHECK(tokens.dim() == 2, "tokens must be [B, N], got ", tokens.sizes());
  const int64_t batch = tokens.size(0), n = tokens.size(1);
  TORCH_CHECK(n >= 1, "the tree needs a root (N >= 1)");
  TORCH_CHECK(parent.sizes() == tokens.sizes() && valid.sizes() == tokens.sizes(),
              "parent and valid must have the shape of tokens");
  TORCH_CHECK(max_depth >= 0, "max_depth must be >= 0");
  TORCH_CHECK(greedy || p_in.has_value(), "p_rows is required unless greedy");
  const at::ScalarType cd = compute_type(greedy ? std::nullopt : p_in, q_in);
  const at::Tensor q = as_compute(q_in, cd, "q_rows");
  TORCH_CHECK(q.dim() == 3 && q.size(0) == batch && q.size(1) == n && q.size(2) > 0, "q_rows must be [B, N, V]");
  const int64_t vocab = q.size(2);
  at::Tensor p;
  if (!greedy) {
    p = as_compute(*p_in, cd, "p_rows");
    TORCH_CHECK(p.sizes() == q.sizes(), "p_rows must have the shape of q_rows ", q.sizes(), ", got ", p.sizes());
  }
  if (accept_u.has_value()) {
    TORCH_CHECK(accept_u->dim() == 3 && accept_u->size(0) == batch && accept_u->size(1) == n,
                "accept_u must be [B, N, Kmax]");
  }
  // drawn: a node has at most N - 1 candidates (kseq: chains), and Philox elements do not depend on the width
  const std::vector<int64_t> u_shape =
      accept_u.has_value() ? accept_u->sizes().vec() : std::vector<int64_t>{batch, n, n > 1 ? n - 1 : 1};
  const at::Tensor u = noise_or_philox(accept_u, u_shape, seed, kAcceptNoise, "accept_u");
  const at::Tensor fin = final_uniforms(final_noise, {batch, vocab}, seed);
  const int64_t ku = u.size(2);
  const bool path_method = method == Method::kBlock || method == Method::kTraversal || method == Method::kTraversalW;
  TORCH_CHECK(greedy || !path_method || ku >= 1, "accept_u must hold at least one uniform per node for method '",
              method_name, "'");
  at::Tensor hub;
  if (hub_in.has_value()) {
    hub = as_long(*hub_in, "hub");
    TORCH_CHECK(hub.sizes() == tokens.sizes(), "hub must be [B, N]");
  }
  TORCH_CHECK(greedy || method != Method::kSpecHub || hub.defined(), "method 'spechub' needs hub");
  at::Tensor eos;
  if (eos_in.has_value()) eos = as_long(*eos_in, "eos").reshape({-1});
  // Memory safety for direct torch.ops calls: level order, token and hub ids in range.
  const int64_t* tok = tokens.const_data_ptr<int64_t>();
  const int64_t* par = parent.const_data_ptr<int64_t>();
  const bool* val = valid.const_data_ptr<bool>();
  const int64_t* h = hub.defined() ? hub.const_data_ptr<int64_t>() : nullptr;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(val[b * n], "valid[", b, ", 0] must be true (the root)");
    for (int64_t m = 0; m < n; ++m) {
      if (!val[b * n + m]) continue;
      TORCH_CHECK(m == 0 || (par[b * n + m] >= 0 && par[b * n + m] < m), "parent[", b, ", ", m,
                  "] must be in [0, ", m, ")");
      TORCH_CHECK(tok[b * n + m] >= 0 && tok[b * n + m] < vocab, "tokens[", b, ", ", m, "] must be in [0, ", vocab,
                  ")");
      if (h != nullptr && method == Method::kSpecHub && !greedy)
        TORCH_CHECK(h[b * n + m] >= 0 && h[b * n + m] < vocab, "hub[", b, ", ", m, "] must be in [0, ", vocab, ")");
    }
  }
  at::Tensor acc_nodes = at::empty({batch, max_depth}, tokens.options());
  at::Tensor acc_rank = at::empty({batch, max_depth}, tokens.options());
  at::Tensor n_acc = at::empty({batch}, tokens.options());
  at::Tensor next = at::empty({batch}, tokens.options());
  const int64_t* e = eos.defined() ? eos.const_data_ptr<int64_t>() : nullptr;
  const int64_t n_eos = eos.defined() ? eos.numel() : 0;
  const int64_t* hub_ptr = method == Method::kSpecHub && !greedy ? h : nullptr;
  if (cd == at::kDouble) {
    tree_rows<double>(tok, par, val, greedy ? nullptr : p.const_data_ptr<double>(), q.const_data_ptr<double>(),
                      method, hub_ptr, u.const_data_ptr<double>(), data_or_null(fin), seed, greedy, e, n_eos,
                      batch, n, vocab, ku, max_depth, acc_nodes.mutable_data_ptr<int64_t>(),
                      n_acc.mutable_data_ptr<int64_t>(), next.mutable_data_ptr<int64_t>(),
                      acc_rank.mutable_data_ptr<int64_t>());
  } else {
    tree_rows<float>(tok, par, val, greedy ? nullptr : p.const_data_ptr<float>(), q.const_data_ptr<float>(), method,
                     hub_ptr, u.const_data_ptr<double>(), data_or_null(fin), seed, greedy, e, n_eos, batch, n,
                     vocab, ku, max_depth, acc_nodes.mutable_data_ptr<int64_t>(), n_acc.mutable_data_ptr<int64_t>(),
                     next.mutable_data_ptr<int64_t>(), acc_rank.mutable_data_ptr<int64_t>());
  }
  return {acc_nodes, n_acc, next, acc_rank};
}

std::tuple<at::Tensor, at::Tensor> verify_chain(const at::Tensor& draft_in, const std::optional<at::Tensor>& p_in,
                                                const at::Tensor& q_in, const at::Tensor& lengths_in,
                                                const std::optional<at::Tensor>& accept_u,
                                                const std::optional<at::Tensor>& final_noise, bool greedy,
                                                const std::optional<at::Tensor>& eos_in, int64_t seed,
                                                double leniency) {
  const at::Tensor draft = as_long(draft_in, "draft");
  const at::Tensor lengths = as_long(lengths_in, "lengths");
  TORCH_CHECK(draft.dim() == 2, "draft must be [B, L], got ", draft.sizes());
  const int64_t batch = draft.size(0), len_max = draft.size(1);
  TORCH_CHECK(q_in.dim() == 3 && q_in.size(0) == batch && q_in.size(1) == len_max + 1,
              "q must be [B, L+1, V] = [", batch, ", ", len_max + 1, ", V], got ", q_in.sizes());
  const int64_t vocab = q_in.size(2);
  TORCH_CHECK(vocab > 0, "q must have V > 0");
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "lengths must be [B=", batch, "]");
  TORCH_CHECK(leniency >= 1.0, "leniency must be >= 1, got ", leniency);
  const bool use_p = !greedy || leniency > 1.0;  // the lenient greedy rule reads p
  TORCH_CHECK(!use_p || p_in.has_value(), "p is required unless greedy (with leniency 1)");
  const at::ScalarType cd = compute_type(use_p ? p_in : std::nullopt, q_in);
  const at::Tensor q = as_compute(q_in, cd, "q");
  at::Tensor p;
  if (use_p) {
    p = as_compute(*p_in, cd, "p");
    TORCH_CHECK(p.dim() == 3 && p.size(0) == batch && p.size(1) == len_max && p.size(2) == vocab,
                "p must be [B, L, V] = [", batch, ", ", len_max, ", ", vocab, "], got ", p.sizes());
  }
  const at::Tensor u = noise_or_philox(accept_u, {batch, len_max}, seed, kAcceptNoise, "accept_u");
  const at::Tensor fin = final_uniforms(final_noise, {batch, vocab}, seed);
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
    chain_rows<double>(d, use_p ? p.const_data_ptr<double>() : nullptr, q.const_data_ptr<double>(), lens,
                       u.const_data_ptr<double>(), data_or_null(fin), seed, greedy, e, n_eos, batch, len_max,
                       vocab, n_acc.mutable_data_ptr<int64_t>(), next.mutable_data_ptr<int64_t>(), leniency);
  } else {
    chain_rows<float>(d, use_p ? p.const_data_ptr<float>() : nullptr, q.const_data_ptr<float>(), lens,
                      u.const_data_ptr<double>(), data_or_null(fin), seed, greedy, e, n_eos, batch, len_max,
                      vocab, n_acc.mutable_data_ptr<int64_t>(), next.mutable_data_ptr<int64_t>(), leniency);
  }
  return {n_acc, next};
}

at::Tensor emission_law(const at::Tensor& p_in, const at::Tensor& q_in, double leniency) {
  TORCH_CHECK(p_in.dim() >= 1 && p_in.sizes() == q_in.sizes(), "p and q must be [..., V] of one shape, got ",
              p_in.sizes(), " and ", q_in.sizes());
  TORCH_CHECK(leniency >= 1.0, "leniency must be >= 1, got ", leniency);
  const at::ScalarType cd = compute_type(p_in, q_in);
  const at::Tensor p = as_compute(p_in, cd, "p"), q = as_compute(q_in, cd, "q");
  at::Tensor out = at::empty(p.sizes(), p.options());
  const int64_t vocab = p.size(-1), rows = vocab ? p.numel() / vocab : 0;
  if (cd == at::kDouble) {
    emission_rows<double>(p.const_data_ptr<double>(), q.const_data_ptr<double>(), rows, vocab, leniency,
                          out.mutable_data_ptr<double>());
  } else {
    emission_rows<float>(p.const_data_ptr<float>(), q.const_data_ptr<float>(), rows, vocab, leniency,
                         out.mutable_data_ptr<float>());
  }
  return out;
}

}  // namespace specdec::cpu
